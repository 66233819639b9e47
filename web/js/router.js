// Routes: "/" (upload and recent plans), "/plans/{id}" (a plan), "/?model=HASH" (a model's
// history). Links with data-nav are followed with the History API, without a reload.

/** The route of a location: {name: 'plan', id} | {name: 'history', hash} | {name: 'home'}. */
export function parseRoute(pathname, search) {
  const m = /^\/plans\/([^/]+)\/?$/.exec(pathname);
  if (m) return { name: 'plan', id: decodeURIComponent(m[1]) };
  const q = new URLSearchParams(search);
  if (q.get('plan')) return { name: 'plan', id: q.get('plan') };
  if (q.get('model')) return { name: 'history', hash: q.get('model') };
  return { name: 'home' };
}

export const planUrl = (id) => `/plans/${encodeURIComponent(id)}`;
export const historyUrl = (hash) => `/?model=${encodeURIComponent(hash)}`;

let renderFn = () => {};

export function navigate(url, { replace = false } = {}) {
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  renderFn();
}

export function startRouter(render) {
  renderFn = render;
  window.addEventListener('popstate', () => renderFn());
  document.addEventListener('click', (ev) => {
    const a = ev.target.closest?.('a[data-nav]');
    if (!a || ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    navigate(a.getAttribute('href'));
  });
  renderFn();
}
