// The remat viewer: entry point and router.

import { h } from './dom.js';
import { parseRoute, startRouter } from './router.js';
import { renderUpload, leaveUpload } from './upload.js';
import { renderPlan, renderHistory, viewState, leavePage } from './planpage.js';

window.__remat = viewState;

const main = document.getElementById('main');

function render() {
  const route = parseRoute(location.pathname, location.search);
  // The upload view's polling stops when it is left: a plan done later does not take the user
  // away from the page they went to (its link is in the recent plans and the model's history).
  leaveUpload();
  viewState.ready = false;
  window.scrollTo(0, 0);
  document.title = 'remat';
  for (const a of document.querySelectorAll('.site-nav a')) a.removeAttribute('aria-current');
  if (route.name === 'plan') renderPlan(main, route.id);
  else if (route.name === 'history') renderHistory(main, route.hash);
  else {
    leavePage();
    document.querySelector('.site-nav a[href="/"]')?.setAttribute('aria-current', 'page');
    renderUpload(main);
    viewState.ready = true;
  }
  main.focus({ preventScroll: true });
}

// An unexpected error is shown above the page rather than failing silently. (Chromium reports
// a benign "ResizeObserver loop" as an error event; it is not one.)
window.addEventListener('error', (ev) => {
  if (/ResizeObserver loop/.test(ev.message ?? '')) return;
  main.prepend(h('div', { class: 'error-box', role: 'alert' }, `The viewer hit an error: ${ev.message}`));
});
window.addEventListener('unhandledrejection', (ev) => {
  if (ev.reason?.name === 'AbortError') return;
  main.prepend(h('div', { class: 'error-box', role: 'alert' }, `The viewer hit an error: ${ev.reason?.message ?? ev.reason}`));
});

startRouter(render);
