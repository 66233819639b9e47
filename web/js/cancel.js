// Cancelling a job the viewer submitted and waits on: DELETE /v1/plans/{id} or /v1/sweeps/{id}
// stops it on the server (queued or running) and forgets it. `JobCancel` is the logic, apart
// from the page so that it can be tested without one; `cancelButton` its button.

import { ApiError, deleteJob } from './api.js';
import { h } from './dom.js';

/** What the page says once a job is stopped. */
export const CANCEL_MESSAGES = { cancelled: 'Cancelled.', gone: 'The job was already gone.' };

/**
 * One job's cancelling. States: `waiting` (the job runs, Cancel can be clicked), `cancelling`
 * (the DELETE is in flight), `cancelled` (204) and `gone` (404: the server no longer had it),
 * after which the job's results are never shown, `failed` (any other answer, or none: the job
 * goes on and Cancel can be clicked again; `error` says why) and `ended` (the job ended on its
 * own: nothing left to cancel).
 *
 * `signal` is for the poll: aborted once the job is cancelled (or gone), and when the parent
 * `signal` given here is (the page is left). Every change of state calls the listeners of `on`.
 */
export class JobCancel {
  constructor(kind, id, { signal, del = deleteJob } = {}) {
    this.kind = kind;
    this.id = id;
    this.state = 'waiting';
    this.error = null;
    this.del = del;
    this.request = null;
    this.listeners = [];
    this.controller = new AbortController();
    if (signal?.aborted) this.controller.abort();
    else signal?.addEventListener('abort', () => this.controller.abort(), { once: true });
  }

  get signal() {
    return this.controller.signal;
  }

  /** The job is cancelled or was already gone: its results are not to be shown. */
  get stopped() {
    return this.state === 'cancelled' || this.state === 'gone';
  }

  /** The DELETE is in flight. */
  get busy() {
    return this.state === 'cancelling';
  }

  /** Nothing is left to cancel (the button goes). */
  get over() {
    return this.stopped || this.state === 'ended';
  }

  /** The page's line for a stopped job, else null. */
  get message() {
    return CANCEL_MESSAGES[this.state] ?? null;
  }

  /** Calls `fn(this)` on every change of state; answers the function that stops it. */
  on(fn) {
    this.listeners.push(fn);
    return () => (this.listeners = this.listeners.filter((f) => f !== fn));
  }

  emit() {
    for (const fn of this.listeners) {
      try {
        fn(this);
      } catch (e) {
        // A listener's failure is the page's error, not the cancel's: reported, never swallowed.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  /**
   * Sends the DELETE (once at a time; a click while one is in flight answers the same promise).
   * Resolves when it has answered, never rejects: the outcome is the state.
   */
  cancel() {
    if (this.state !== 'waiting' && this.state !== 'failed') return this.request ?? Promise.resolve();
    this.state = 'cancelling';
    this.error = null;
    this.emit();
    this.request = (async () => {
      try {
        await this.del(this.kind, this.id);
        this.state = 'cancelled';
      } catch (e) {
        if (e instanceof ApiError && e.status === 404) this.state = 'gone';
        else {
          this.state = 'failed';
          this.error = e instanceof ApiError ? e : new ApiError(0, 'network', String(e?.message ?? e));
        }
      }
      if (this.stopped) this.controller.abort();
      this.emit();
    })();
    return this.request;
  }

  /** The job ended on its own (done or failed): the button goes. Not after a cancel. */
  end() {
    if (this.state !== 'waiting' && this.state !== 'failed') return;
    this.state = 'ended';
    this.emit();
  }

  /**
   * May a result of the job be shown (a poll's answer, an error, a navigation to the plan)?
   * Waits for a DELETE in flight; false once the job is cancelled or gone, so that an answer
   * that comes back after the Cancel never takes the page anywhere.
   */
  async keep() {
    while (this.state === 'cancelling') await this.request;
    return !this.stopped;
  }
}

/** The AbortError a wait on a cancelled job ends with (pages return quietly on it). */
export function cancelledError() {
  return new DOMException('the job was cancelled', 'AbortError');
}

/**
 * The outcome of `wait` (the poll of `job`, with `job.signal`), unless the job is cancelled
 * first: then an AbortError, even when the poll answered (done, failed, 404) while the DELETE was
 * in flight or came back after it. Either way the job's button goes.
 */
export async function unlessCancelled(job, wait) {
  try {
    const result = await wait;
    if (!(await job.keep())) throw cancelledError();
    return result;
  } catch (e) {
    if (!(await job.keep())) throw cancelledError();
    throw e;
  } finally {
    job.end();
  }
}

/**
 * The Cancel button of a job: named for what it cancels (`name`, e.g. "plan p0003"), disabled
 * while the DELETE is in flight, removed once nothing is left to cancel. When a cancel it was
 * clicked for stops the job, focus goes to `focusAfter` (the line that says so).
 */
export function cancelButton(job, { name = `${job.kind} ${job.id}`, focusAfter = null } = {}) {
  let clicked = false;
  const button = h('button', { type: 'button', class: 'btn small cancel', 'aria-label': `Cancel ${name}`, 'data-testid': 'cancel-job', onclick: () => ((clicked = true), job.cancel()) }, 'Cancel');
  job.on(() => {
    button.disabled = job.busy;
    // Focus is where the click left it, unless disabling the button moved it to the body.
    const doc = button.ownerDocument;
    const lost = clicked && (!doc.activeElement || doc.activeElement === button || doc.activeElement === doc.body);
    if (!job.over) {
      // Refused: the button is back for a retry, with the focus it had.
      if (job.state === 'failed' && lost) button.focus({ preventScroll: true });
      return;
    }
    button.remove();
    if (job.stopped && lost) focusAfter?.focus({ preventScroll: true });
  });
  return button;
}
