// The hookline portal: subscriptions, their delivery log, resume, replay and redrive, over the ingest's JSON API
// with the bearer token the user typed (kept in sessionStorage). Plain ES module, no framework, no build step.

import { renderChart } from './chart.js';

const TOKEN_KEY = 'hookline.portal.token';
const REFRESH_MS = 3000;
const PAGE = 25;

const $ = (id) => document.getElementById(id);
const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  view: null,
  subId: null,
  sub: null,
  subsCursor: [null], // stack of `after` cursors of the subscription list
  subsNext: null,
  logCursor: [null],
  logNext: null,
  expanded: new Set(),
  attempts: new Map(), // delivery id -> { key, entry }
  lastRender: new Map(), // part -> JSON of what it shows, to skip identical re-renders
  apiDown: false,
  timer: null,
};

// ---------- helpers ----------

class AuthError extends Error {}
class ApiDown extends Error {}
class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

function h(name, attrs = {}, ...children) {
  const n = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v == null) continue;
    if (k === 'class') n.className = v;
    else if (k.startsWith('on')) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) if (c != null && c !== false) n.append(c);
  return n;
}

const pad2 = (n) => String(n).padStart(2, '0');
function fmtTime(ms) {
  if (!ms) return '–';
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}
function ago(ms) {
  if (!ms) return '';
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 60) return `${Math.max(s, 0)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
const fmtDur = (ms) => (ms == null ? '–' : ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${ms} ms`);
/// `datetime-local` value (local time) -> epoch ms, or null.
function localToMs(v) {
  if (!v) return null;
  const t = new Date(v).getTime();
  return Number.isNaN(t) ? null : t;
}
function msToLocal(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}T${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}
const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v != null && v !== '') s.set(k, v);
  const t = s.toString();
  return t ? `?${t}` : '';
};

function announce(text) {
  const live = $('live');
  live.textContent = '';
  setTimeout(() => { live.textContent = text; }, 50);
}

function setResult(el, text, kind = 'ok') {
  el.textContent = text;
  el.className = `result ${kind}`;
}

function banner(text) {
  const b = $('banner');
  if (text) {
    b.textContent = text;
    b.hidden = false;
  } else {
    b.hidden = true;
    b.textContent = '';
  }
}

// ---------- API ----------

async function api(method, path, body, extraHeaders) {
  const headers = { authorization: `Bearer ${state.token}`, ...(extraHeaders || {}) };
  if (body !== undefined) headers['content-type'] = 'application/json';
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  } catch (e) {
    state.apiDown = true;
    banner('The API is unreachable (the ingest service is down or the network is). The page keeps retrying.');
    throw new ApiDown(String(e));
  }
  if (resp.status === 401) {
    signOut('token expired or invalid');
    throw new AuthError('unauthorized');
  }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (resp.status >= 502 && !data) {
    state.apiDown = true;
    banner(`The API answered HTTP ${resp.status}: it is down or restarting. The page keeps retrying.`);
    throw new ApiDown(`HTTP ${resp.status}`);
  }
  if (state.apiDown) {
    state.apiDown = false;
    banner('');
  }
  if (!resp.ok) {
    const e = data && data.error ? data.error : {};
    throw new ApiError(resp.status, e.code || `http_${resp.status}`, e.message || `HTTP ${resp.status}`, e.field);
  }
  return data;
}

/// What to tell the user about a failed call (auth errors already went back to the sign-in form).
function describe(e) {
  if (e instanceof ApiError) return `${e.message} (${e.code})`;
  if (e instanceof ApiDown) return 'the API is unreachable';
  return String(e && e.message ? e.message : e);
}

// ---------- sign-in ----------

function signOut(message) {
  state.token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  stopTimer();
  show('signin');
  $('session').hidden = true;
  $('signin-error').textContent = message || '';
  $('token').value = '';
  $('token').focus();
}

async function signIn(token) {
  state.token = token;
  try {
    await api('GET', '/v1/subscriptions?limit=1');
  } catch (e) {
    if (!(e instanceof AuthError)) $('signin-error').textContent = `Could not sign in: ${describe(e)}.`;
    state.token = '';
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('signin-error').textContent = '';
  $('session').hidden = false;
  route(true);
}

// ---------- views ----------

function show(view) {
  state.view = view;
  for (const v of ['signin', 'list', 'detail']) $(`${v}-view`).hidden = v !== view;
}

function route(focus) {
  if (!state.token) return signOut('');
  $('session').hidden = false;
  const m = location.hash.match(/^#\/subscriptions\/([^/?#]+)/);
  const newId = m ? decodeURIComponent(m[1]) : null;
  if (newId !== state.subId) {
    state.logCursor = [null];
    state.expanded.clear();
    state.attempts.clear();
    state.lastRender.clear();
    setResult($('action-result'), '');
  }
  state.subId = newId;
  if (newId) {
    show('detail');
    if (!$('replay-since').value) $('replay-since').value = msToLocal(Date.now() - 3600e3);
  } else {
    show('list');
  }
  refresh().then(() => {
    if (focus) {
      const heading = newId ? $('sub-title') : $('list-h');
      heading.setAttribute('tabindex', '-1');
      heading.focus();
    }
  });
  startTimer();
}

function startTimer() {
  stopTimer();
  state.timer = setInterval(() => {
    if (!$('auto-refresh').checked || document.querySelector('dialog[open]')) return;
    refresh();
  }, REFRESH_MS);
}
function stopTimer() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

// One refresh at a time; a refresh asked for meanwhile (the view changed, an action finished) runs right after.
let refreshing = null;
let again = false;
function refresh() {
  if (refreshing) {
    again = true;
    return refreshing;
  }
  refreshing = (async () => {
    do {
      again = false;
      try {
        if (state.view === 'list') await Promise.all([loadList(), loadFound()]);
        else if (state.view === 'detail') await Promise.all([loadSub(), loadLog(), loadChart()]);
      } catch (e) {
        // AuthError: back at the sign-in form already; ApiDown: the banner says it.
        if (!(e instanceof AuthError) && !(e instanceof ApiDown)) console.error(e);
      }
    } while (again && state.token);
  })().finally(() => {
    refreshing = null;
  });
  return refreshing;
}

/// Re-renders a part only when what it shows changed, keeping focus on the element with the same key.
function renderPart(part, data, container, build) {
  const key = JSON.stringify(data);
  if (state.lastRender.get(part) === key) return;
  state.lastRender.set(part, key);
  const focused = document.activeElement && container.contains(document.activeElement) ? document.activeElement.dataset.key : null;
  container.replaceChildren(...[build()].flat());
  if (focused) {
    const again = container.querySelector(`[data-key="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

function stateBadge(sub) {
  const reason = sub.disabled_reason ? ` (${sub.disabled_reason})` : '';
  const word = !sub.enabled && sub.state === 'disabled' && !sub.disabled_reason ? 'disabled by its owner' : `${sub.state}${reason}`;
  const badge = h('span', { class: `badge s-${sub.state}`, 'data-testid': 'state' }, word);
  // The policy's circuit breaker: shown only while it holds requests back.
  const cb = sub.circuit_breaker;
  if (!cb || cb.state === 'closed') return badge;
  const until = cb.open_until_ms ? ` until ${fmtTime(cb.open_until_ms)}` : '';
  const breaker = h('span', { class: 'badge s-paused', 'data-testid': 'breaker', title: 'No requests after repeated connect errors or timeouts; deliveries wait, uncounted' },
    cb.state === 'open' ? `circuit open${until}` : 'circuit probing');
  return h('span', {}, badge, ' ', breaker);
}

// ----- subscription list -----

async function loadList() {
  const after = state.subsCursor[state.subsCursor.length - 1];
  const page = await api('GET', `/v1/subscriptions${q({ limit: PAGE, after })}`);
  state.subsNext = page.next_after;
  $('subs-prev').disabled = state.subsCursor.length <= 1;
  $('subs-next').disabled = !page.next_after;
  renderPart('subs', page.items, $('subs'), () => {
    if (page.items.length === 0) {
      return h('p', { class: 'empty' }, 'No subscriptions yet. ', h('button', { type: 'button', onclick: () => openSubDialog(null) }, 'Create the first one'));
    }
    return h('table', { class: 'table' },
      h('caption', { class: 'sr-only' }, 'Subscriptions'),
      h('thead', {}, h('tr', {}, ...['Endpoint', 'Event types', 'Policy', 'State', 'Consecutive failures', 'Last success'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, page.items.map((s) => h('tr', {},
        h('td', {}, h('a', { href: `#/subscriptions/${encodeURIComponent(s.id)}`, class: 'url', 'data-key': `sub-${s.id}` }, s.url),
          s.description ? h('div', { class: 'muted' }, s.description) : null),
        h('td', {}, s.event_types.join(', ')),
        h('td', {}, s.policy),
        h('td', {}, stateBadge(s)),
        h('td', { class: 'num' }, String(s.consecutive_failures)),
        h('td', { title: fmtTime(s.last_success_at_ms) }, s.last_success_at_ms ? ago(s.last_success_at_ms) : 'never'),
      ))));
  });
}

// ----- one subscription -----

async function loadSub() {
  let sub;
  try {
    sub = await api('GET', `/v1/subscriptions/${encodeURIComponent(state.subId)}`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) {
      $('sub-title').textContent = 'No such subscription';
      $('sub-state').replaceChildren();
      $('sub-facts').replaceChildren(h('div', {}, h('dt', {}, 'Error'), h('dd', {}, describe(e))));
      return;
    }
    throw e;
  }
  state.sub = sub;
  $('sub-title').textContent = sub.url;
  document.title = `${sub.url} — hookline portal`;
  renderPart('sub-state', [sub.state, sub.disabled_reason, sub.enabled, sub.circuit_breaker && sub.circuit_breaker.state], $('sub-state'), () => stateBadge(sub));
  const facts = [
    ['ID', sub.id],
    ['Event types', sub.event_types.join(', ')],
    ['Policy', sub.policy + (sub.policy_error ? ` — invalid: ${sub.policy_error}` : '')],
    ['State', sub.disabled_reason ? `${sub.state}: ${sub.disabled_reason}` : sub.state],
    ['Verification', sub.verification_error ? `${sub.verification}: ${sub.verification_error}` : (sub.verification || 'not_required')],
    ['Rate limit', sub.rate_limit ? `${sub.rate_limit.per_s}/s, burst ${sub.rate_limit.burst}` : 'none'],
    ['Consecutive failures', String(sub.consecutive_failures)],
    ['Last success', sub.last_success_at_ms ? `${fmtTime(sub.last_success_at_ms)} (${ago(sub.last_success_at_ms)})` : 'never'],
    ['Failing since', sub.first_failure_at_ms ? fmtTime(sub.first_failure_at_ms) : '–'],
    ['Description', sub.description || '–'],
  ];
  renderPart('facts', facts, $('sub-facts'), () => facts.map(([k, v]) => h('div', { 'data-fact': k }, h('dt', {}, k), h('dd', {}, v))));
  const inactive = sub.state !== 'active';
  const resume = $('btn-resume');
  resume.hidden = !inactive;
  resume.textContent = sub.enabled ? 'Resume' : 'Enable';
  $('btn-pause').hidden = inactive;
}

async function loadLog() {
  const after = state.logCursor[state.logCursor.length - 1];
  const params = {
    limit: PAGE,
    after,
    state: $('f-status').value,
    since_ms: localToMs($('f-since').value),
    until_ms: localToMs($('f-until').value),
  };
  const page = await api('GET', `/v1/subscriptions/${encodeURIComponent(state.subId)}/deliveries${q(params)}`);
  state.logNext = page.next_after;
  $('log-newer').disabled = state.logCursor.length <= 1;
  $('log-older').disabled = !page.next_after;
  $('log-page').textContent = `page ${state.logCursor.length}`;
  // Attempts of expanded rows, fetched again when the delivery changed.
  await Promise.all(page.items.filter((d) => state.expanded.has(d.delivery_id)).map(async (d) => {
    const key = `${d.last_attempt_at_ms}:${d.state}:${d.attempts_made}`;
    const cached = state.attempts.get(d.delivery_id);
    if (cached && cached.key === key) return;
    try {
      state.attempts.set(d.delivery_id, { key, entry: await api('GET', `/v1/deliveries/${encodeURIComponent(d.delivery_id)}`) });
    } catch (e) {
      if (e instanceof AuthError || e instanceof ApiDown) throw e;
      state.attempts.set(d.delivery_id, { key, error: describe(e) });
    }
  }));
  const filtered = Boolean(params.state || params.since_ms || params.until_ms);
  const shown = page.items.map((d) => [d, state.expanded.has(d.delivery_id) ? state.attempts.get(d.delivery_id) : null]);
  renderPart('log', shown, $('log'), () => {
    if (page.items.length === 0) {
      return h('p', { class: 'empty' }, filtered ? 'No deliveries match these filters.' : 'No deliveries yet. Publish an event that matches this subscription’s event types.');
    }
    return h('table', { class: 'table log' },
      h('caption', { class: 'sr-only' }, 'Deliveries, newest first'),
      h('thead', {}, h('tr', {}, ...['Delivery', 'Event type', 'State', 'Attempts', 'Last attempt', 'Actions'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, shown.map(([d, att]) => logRows(d, att))));
  });
}

function attemptResult(a) {
  if (!a) return '–';
  if (a.http_status) return `HTTP ${a.http_status}`;
  return a.reason || a.outcome || '–';
}

function logRows(d, att) {
  const open = state.expanded.has(d.delivery_id);
  const panelId = `att-${d.delivery_id}`;
  const last = d.last_attempt;
  const row = h('tr', { 'data-delivery': d.delivery_id, class: `st-${d.state}` },
    h('td', {}, h('code', { title: d.delivery_id }, d.event_id || d.delivery_id)),
    h('td', {}, d.event_type),
    // hookline's word for the state; the policy's own word (Fynapse's DEAD_LETTER) only as a hint.
    h('td', {}, h('span', { class: `badge d-${d.state}`, 'data-testid': 'delivery-status', title: d.platform_status && d.platform_status !== d.state ? `the policy says ${d.platform_status}` : d.state }, d.state)),
    h('td', { class: 'num' }, String(d.attempts_made)),
    h('td', {}, last ? `${fmtTime(last.started_at_ms)} · ${attemptResult(last)} · ${fmtDur(last.duration_ms)}` : '–'),
    h('td', { class: 'actions' },
      h('button', {
        type: 'button', 'aria-expanded': String(open), 'aria-controls': panelId, 'data-key': `att-${d.delivery_id}`,
        onclick: () => toggleAttempts(d.delivery_id),
      }, open ? 'Hide attempts' : 'Attempts'),
      d.replayable ? h('button', { type: 'button', 'data-key': `replay-${d.delivery_id}`, onclick: () => replayOne(d) }, 'Replay…') : null));
  if (!open) return [row];
  let body;
  if (!att) body = h('p', {}, 'Loading…');
  else if (att.error) body = h('p', { class: 'error' }, att.error);
  else {
    body = attemptsTable(att.entry, `Attempts of ${d.event_id} (${att.entry.attempts.length} kept)`);
  }
  return [row, h('tr', { class: 'attempts-row', id: panelId }, h('td', { colspan: 6 }, body))];
}

// ----- attempt detail (shared by the subscription's log and the event search) -----

/// A delivery's attempts, oldest first: result, the policy's reasoning, the response excerpt, and per attempt the
/// request headers as sent (signatures and credentials arrive `<redacted>` from the API) and the response's.
function attemptsTable(entry, caption) {
  return h('table', { class: 'table attempts' },
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, ...['#', 'Time', 'Result', 'Duration', 'Verdict', 'Response excerpt', 'Headers'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, entry.attempts.map((a, i) => h('tr', { 'data-attempt': a.attempt },
      h('td', { class: 'num', title: `attempt ${a.attempt} of its run, try ${a.try}` }, String(i + 1)),
      h('td', {}, fmtTime(a.started_at_ms)),
      h('td', {}, attemptResult(a), a.http_status && a.reason && a.reason !== `HTTP ${a.http_status}` ? h('div', { class: 'muted' }, a.reason) : null),
      h('td', { class: 'num' }, fmtDur(a.duration_ms)),
      h('td', {}, a.verdict + (a.next_attempt_at_ms ? ` (next ${fmtTime(a.next_attempt_at_ms)})` : ''), reasoning(a)),
      h('td', {}, a.response_excerpt ? h('code', { class: 'excerpt' }, a.response_excerpt.length > 300 ? `${a.response_excerpt.slice(0, 300)}…` : a.response_excerpt) : h('span', { class: 'muted' }, 'empty')),
      h('td', {}, attemptHeaders(a, i))))));
}

const DECIDED_BY = {
  success_rule: 'a success rule matched',
  terminal_rule: 'a terminal rule matched',
  micro_retry: 'tried again inside the attempt',
  schedule: 'next attempt on the schedule',
  retry_after: 'next attempt when the receiver’s Retry-After asked',
  attempts_exhausted: 'no attempt left',
  window_exhausted: 'past the retry window',
};

function reasoning(a) {
  if (!a.decided_by && !a.rule) return null;
  const rule = a.rule ? `rule ${a.rule.number} (${a.rule.when})` : null;
  return h('div', { class: 'muted', 'data-testid': 'reasoning' }, [rule, DECIDED_BY[a.decided_by] || a.decided_by].filter(Boolean).join(': '));
}

function headerList(title, pairs) {
  if (!pairs || pairs.length === 0) return h('p', { class: 'muted' }, `${title}: none recorded`);
  return h('table', { class: 'headers', 'data-testid': title === 'Request headers' ? 'request-headers' : 'response-headers' },
    h('caption', {}, title),
    h('tbody', {}, pairs.map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, h('code', { class: v === '<redacted>' ? 'redacted' : null }, v))))));
}

function attemptHeaders(a, i) {
  if (!a.request_headers && !a.response_headers) return h('span', { class: 'muted' }, '–');
  return h('details', { class: 'attempt-headers', 'data-key': `hdr-${a.run_id || ''}-${a.attempt}-${a.try}-${i}` },
    h('summary', {}, `Headers (${(a.request_headers || []).length} sent, ${(a.response_headers || []).length} received)`),
    headerList('Request headers', a.request_headers),
    headerList('Response headers', a.response_headers));
}

// ----- search by event id (GET /v1/deliveries?event_id=) -----

const find = { eventId: '', open: null };

async function loadFound() {
  if (!find.eventId) return;
  const page = await api('GET', `/v1/deliveries${q({ event_id: find.eventId })}`);
  renderPart('found', page.items, $('found'), () => {
    if (page.items.length === 0) return h('p', { class: 'empty' }, `No delivery of event ${find.eventId} in the delivery log (yet).`);
    return h('table', { class: 'table log' },
      h('caption', {}, `Deliveries of event ${find.eventId}`),
      h('thead', {}, h('tr', {}, ...['Subscription', 'Delivery', 'State', 'Attempts', 'Last attempt', 'Actions'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, page.items.map((d) => h('tr', { 'data-found': d.delivery_id, class: `st-${d.state}` },
        h('td', {}, h('a', { href: `#/subscriptions/${encodeURIComponent(d.subscription_id)}` }, h('code', {}, d.subscription_id))),
        h('td', {}, h('code', {}, d.delivery_id)),
        h('td', {}, h('span', { class: `badge d-${d.state}`, 'data-testid': 'found-status' }, d.state)),
        h('td', { class: 'num' }, String(d.attempts_made)),
        h('td', {}, d.last_attempt ? `${fmtTime(d.last_attempt.started_at_ms)} · ${attemptResult(d.last_attempt)}` : '–'),
        h('td', { class: 'actions' },
          h('button', { type: 'button', 'data-key': `open-${d.delivery_id}`, 'aria-controls': 'found-delivery', onclick: () => openFound(d.delivery_id) }, 'Open'))))));
  });
  if (find.open) await loadFoundDelivery();
}

async function loadFoundDelivery() {
  let d;
  try {
    d = await api('GET', `/v1/deliveries/${encodeURIComponent(find.open)}`);
  } catch (e) {
    if (e instanceof AuthError || e instanceof ApiDown) throw e;
    renderPart('found-delivery', { error: describe(e) }, $('found-delivery'), () => h('p', { class: 'error' }, describe(e)));
    return;
  }
  renderPart('found-delivery', d, $('found-delivery'), () => [
    h('h3', { id: 'found-h', tabindex: '-1' }, `Delivery ${d.delivery_id}`),
    h('dl', { class: 'facts' },
      ...[['Event', `${d.event_id} (${d.event_type})`], ['Subscription', d.subscription_id], ['State', d.state], ['Attempts', String(d.attempts_made)]]
        .map(([k, v]) => h('div', { 'data-fact': k }, h('dt', {}, k), h('dd', {}, v)))),
    h('div', { class: 'toolbar' },
      d.replayable ? h('button', { type: 'button', id: 'found-resend', 'data-key': 'found-resend', onclick: () => resendFound(d) }, 'Resend…')
        : h('span', { class: 'muted' }, d.state === 'pending' ? 'Not finished yet: it can be resent once it is.' : 'Its event is no longer stored: it cannot be resent.')),
    attemptsTable(d, `Attempts (${d.attempts.length} kept)`),
  ]);
}

async function searchEvent(ev) {
  ev.preventDefault();
  const id = $('find-event').value.trim();
  setResult($('find-result'), id ? '' : 'Enter an event id.', id ? 'ok' : 'error');
  if (!id) return;
  find.eventId = id;
  find.open = null;
  state.lastRender.delete('found');
  $('found-delivery').replaceChildren();
  state.lastRender.delete('found-delivery');
  try {
    await loadFound();
  } catch (e) {
    if (!(e instanceof AuthError) && !(e instanceof ApiDown)) setResult($('find-result'), `Search failed: ${describe(e)}`, 'error');
  }
}

async function openFound(id) {
  find.open = id;
  state.lastRender.delete('found-delivery');
  try {
    await loadFoundDelivery();
    $('found-h').focus();
  } catch (e) {
    if (!(e instanceof AuthError) && !(e instanceof ApiDown)) setResult($('find-result'), `Failed: ${describe(e)}`, 'error');
  }
}

async function resendFound(d) {
  const ok = await confirmDialog({
    title: 'Resend this delivery?',
    body: `Event ${d.event_id} (${d.event_type}) is sent again to subscription ${d.subscription_id}, with the same event id.`,
    ok: 'Resend',
  });
  if (!ok) return;
  await action($('find-result'), async () => {
    const r = await api('POST', `/v1/deliveries/${encodeURIComponent(d.delivery_id)}/replay`);
    return `Resend of ${d.event_id} accepted (${r.replayed} delivery queued).`;
  });
}

async function toggleAttempts(id) {
  if (state.expanded.has(id)) state.expanded.delete(id);
  else state.expanded.add(id);
  state.lastRender.delete('log');
  await refresh();
}

async function loadChart() {
  const [span, bucket] = $('chart-range').value.split(':').map(Number);
  const stats = await api('GET', `/v1/subscriptions/${encodeURIComponent(state.subId)}/stats${q({ since_ms: Date.now() - span, bucket_ms: bucket })}`);
  // Re-draw only when the numbers changed (the window moves every minute).
  renderPart('chart', [stats.since_ms, stats.buckets], $('chart'), () => {
    const box = document.createElement('div');
    renderChart(box, stats);
    return [...box.childNodes];
  });
}

// ---------- dialogs ----------

// The open confirmation's settle function. Settled by the buttons and Escape directly, not by the dialog's `close`
// event: that event is queued, and a stale one could otherwise settle the next confirmation.
let settleConfirm = null;

function confirmDialog({ title, body, ok }) {
  const d = $('confirm-dialog');
  if (settleConfirm) settleConfirm(false);
  $('confirm-h').textContent = title;
  $('confirm-body').textContent = body;
  $('confirm-ok').textContent = ok;
  const opener = document.activeElement;
  return new Promise((resolve) => {
    settleConfirm = (yes) => {
      settleConfirm = null;
      if (d.open) d.close();
      if (opener && opener !== document.body && document.contains(opener)) opener.focus();
      resolve(yes);
    };
    d.showModal();
    $('confirm-ok').focus();
  });
}

/// Moves focus to `el` unless the user has already moved it somewhere meaningful.
function focusIfLost(el, ...stale) {
  const a = document.activeElement;
  if (!a || a === document.body || stale.includes(a)) el.focus();
}

async function action(resultEl, run) {
  setResult(resultEl, 'Working…', 'busy');
  try {
    const text = await run();
    setResult(resultEl, text, 'ok');
    announce(text);
  } catch (e) {
    if (e instanceof AuthError) return;
    const text = `Failed: ${describe(e)}`;
    setResult(resultEl, text, 'error');
    announce(text);
  }
  state.lastRender.clear();
  await refresh();
}

let editing = null;
/// The Idempotency-Key of the create being submitted: the same while the form is submitted again unchanged (after
/// a lost answer, a second click), so the API returns the subscription it made instead of a second one.
let createKey = null;
function idempotencyKeyFor(body) {
  const text = JSON.stringify(body);
  if (!createKey || createKey.body !== text) {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    createKey = { body: text, key: `portal-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}` };
  }
  return createKey.key;
}
function openSubDialog(sub) {
  editing = sub;
  createKey = null;
  $('sub-dialog-h').textContent = sub ? 'Edit subscription' : 'New subscription';
  $('sf-url').value = sub ? sub.url : '';
  $('sf-types').value = sub ? sub.event_types.join(', ') : '';
  $('sf-policy').value = sub ? sub.policy : 'standard';
  $('sf-toml').value = '';
  $('sf-desc').value = sub ? sub.description : '';
  $('sf-error').textContent = '';
  $('sub-dialog').showModal();
  $('sf-url').focus();
}

async function saveSub(ev) {
  ev.preventDefault();
  const body = {
    url: $('sf-url').value.trim(),
    event_types: $('sf-types').value.split(',').map((s) => s.trim()).filter(Boolean),
    description: $('sf-desc').value,
  };
  const policy = $('sf-policy').value;
  const toml = $('sf-toml').value.trim();
  if (policy === 'inline') {
    if (toml) body.policy_toml = toml;
    else if (!editing || editing.policy !== 'inline') {
      $('sf-error').textContent = 'An inline policy needs its TOML.';
      $('sf-toml').focus();
      return;
    }
  } else {
    body.policy = policy;
  }
  try {
    const saved = editing
      ? await api('PATCH', `/v1/subscriptions/${encodeURIComponent(editing.id)}`, body)
      : await api('POST', '/v1/subscriptions', body, { 'idempotency-key': idempotencyKeyFor(body) });
    $('sub-dialog').close('saved');
    state.lastRender.clear();
    if (editing) {
      setResult($('action-result'), 'Saved.', 'ok');
      announce('Subscription saved.');
      await refresh();
    } else {
      showSecret(saved.secret, `Subscription ${saved.id} created.`);
      location.hash = `#/subscriptions/${encodeURIComponent(saved.id)}`;
    }
  } catch (e) {
    if (e instanceof AuthError) { $('sub-dialog').close(); return; }
    $('sf-error').textContent = `Not saved: ${describe(e)}`;
    const field = e.field ? { url: 'sf-url', policy: 'sf-policy', policy_toml: 'sf-toml' }[e.field] || (e.field.startsWith('event_types') ? 'sf-types' : null) : null;
    if (field) $(field).focus();
  }
}

function showSecret(secret, note) {
  $('secret-value').value = secret;
  $('secret-note').textContent = note || '';
  $('secret-dialog').showModal();
  $('secret-value').focus();
  $('secret-value').select();
}

// ---------- actions ----------

async function replayOne(d) {
  const ok = await confirmDialog({
    title: 'Replay this delivery?',
    body: `Event ${d.event_id} (${d.event_type}) is sent again to ${state.sub ? state.sub.url : 'the endpoint'} with the same webhook-id.`,
    ok: 'Replay',
  });
  if (!ok) return;
  await action($('action-result'), async () => {
    const r = await api('POST', `/v1/deliveries/${encodeURIComponent(d.delivery_id)}/replay`);
    return `Replay of ${d.event_id} accepted (${r.replayed} delivery queued).`;
  });
}

async function replaySince(ev) {
  ev.preventDefault();
  const since = localToMs($('replay-since').value);
  if (since == null) {
    setResult($('action-result'), 'Choose the time to replay from.', 'error');
    $('replay-since').focus();
    return;
  }
  const ok = await confirmDialog({
    title: 'Replay every event since this time?',
    body: `Every event accepted since ${fmtTime(since)} that matches ${state.sub ? state.sub.event_types.join(', ') : 'the event types'} is delivered again, including those that succeeded.`,
    ok: 'Replay',
  });
  if (!ok) return;
  await action($('action-result'), async () => {
    const r = await api('POST', `/v1/subscriptions/${encodeURIComponent(state.subId)}/replay`, { since_ms: since });
    return `Replayed ${r.replayed} ${r.replayed === 1 ? 'delivery' : 'deliveries'} since ${fmtTime(since)}.`;
  });
}

async function redrive() {
  const ok = await confirmDialog({
    title: 'Redrive the dead letters?',
    body: 'Every dead-lettered delivery of this subscription that has not succeeded since is sent again.',
    ok: 'Redrive',
  });
  if (!ok) return;
  await action($('action-result'), async () => {
    const r = await api('POST', '/v1/dlq/redrive', { subscription_id: state.subId });
    return `Redrove ${r.redriven} dead ${r.redriven === 1 ? 'letter' : 'letters'}${r.skipped ? `, skipped ${r.skipped}` : ''}.`;
  });
}

async function resume() {
  const sub = state.sub;
  await action($('action-result'), async () => {
    const r = sub.enabled
      ? await api('POST', `/v1/subscriptions/${encodeURIComponent(sub.id)}/resume`)
      : await api('PATCH', `/v1/subscriptions/${encodeURIComponent(sub.id)}`, { enabled: true });
    return `${sub.enabled ? 'Resumed' : 'Enabled'}: the subscription is ${r.state}.`;
  });
  focusIfLost($('btn-pause'), $('btn-resume'));
}

async function pause() {
  await action($('action-result'), async () => {
    const r = await api('POST', `/v1/subscriptions/${encodeURIComponent(state.subId)}/pause`);
    return `Paused: the subscription is ${r.state}; its deliveries wait or are skipped as its policy says.`;
  });
  focusIfLost($('btn-resume'), $('btn-pause'));
}

async function rotate() {
  const ok = await confirmDialog({
    title: 'Rotate the signing secret?',
    body: 'A new secret signs from now on; the old one keeps signing next to it for one day, so the receiver can switch without a gap.',
    ok: 'Rotate',
  });
  if (!ok) return;
  try {
    const r = await api('POST', `/v1/subscriptions/${encodeURIComponent(state.subId)}/rotate-secret`);
    setResult($('action-result'), 'Secret rotated.', 'ok');
    showSecret(r.secret, `The previous secrets stop signing at ${fmtTime(r.previous_secrets_expire_at_ms)}.`);
  } catch (e) {
    if (!(e instanceof AuthError)) setResult($('action-result'), `Failed: ${describe(e)}`, 'error');
  }
}

// ---------- wiring ----------

function wire() {
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('token').value.trim();
    if (!t) {
      $('signin-error').textContent = 'Enter an API token.';
      return;
    }
    signIn(t);
  });
  $('sign-out').addEventListener('click', () => signOut('Signed out.'));
  $('refresh').addEventListener('click', () => { state.lastRender.clear(); refresh(); });
  $('skip').addEventListener('click', (ev) => { ev.preventDefault(); $('main').focus(); });
  window.addEventListener('hashchange', () => route(true));

  $('btn-create').addEventListener('click', () => openSubDialog(null));
  $('subs-next').addEventListener('click', () => { if (state.subsNext) { state.subsCursor.push(state.subsNext); refresh(); } });
  $('subs-prev').addEventListener('click', () => { if (state.subsCursor.length > 1) { state.subsCursor.pop(); refresh(); } });

  $('btn-resume').addEventListener('click', resume);
  $('btn-pause').addEventListener('click', pause);
  $('btn-edit').addEventListener('click', () => state.sub && openSubDialog(state.sub));
  $('btn-rotate').addEventListener('click', rotate);
  $('btn-redrive').addEventListener('click', redrive);
  $('replay-since-form').addEventListener('submit', replaySince);
  $('chart-range').addEventListener('change', () => { state.lastRender.delete('chart'); refresh(); });

  $('find-form').addEventListener('submit', searchEvent);
  $('log-filter').addEventListener('submit', (ev) => { ev.preventDefault(); state.logCursor = [null]; refresh(); });
  $('f-clear').addEventListener('click', () => {
    $('f-status').value = ''; $('f-since').value = ''; $('f-until').value = '';
    state.logCursor = [null];
    refresh();
  });
  $('log-older').addEventListener('click', () => { if (state.logNext) { state.logCursor.push(state.logNext); refresh(); } });
  $('log-newer').addEventListener('click', () => { if (state.logCursor.length > 1) { state.logCursor.pop(); refresh(); } });

  // Dialogs: Escape closes them natively (returnValue stays "cancel"); Cancel buttons too.
  $('confirm-form').addEventListener('submit', (ev) => { ev.preventDefault(); if (settleConfirm) settleConfirm(true); });
  $('confirm-cancel').addEventListener('click', () => { if (settleConfirm) settleConfirm(false); });
  $('confirm-dialog').addEventListener('cancel', () => { if (settleConfirm) settleConfirm(false); });
  $('confirm-dialog').addEventListener('close', () => { if (settleConfirm && !$('confirm-dialog').open) settleConfirm(false); });
  $('sub-form').addEventListener('submit', saveSub);
  $('sf-cancel').addEventListener('click', () => $('sub-dialog').close('cancel'));
  $('secret-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    $('secret-value').value = '';
    $('secret-dialog').close();
  });
  $('secret-dialog').addEventListener('close', () => { $('secret-value').value = ''; });
  $('secret-copy').addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText($('secret-value').value);
      announce('Secret copied.');
    } catch {
      $('secret-value').select();
      announce('Copy is not allowed here: the secret is selected, press Ctrl+C.');
    }
  });
}

wire();
// `hookline dev` prints a link ending in `#token=...` that signs in at once. The token is taken out of the
// address straight away, so it is neither kept in the history nor sent on in a Referer.
const linked = location.hash.match(/^#token=([^&]+)$/);
if (linked) {
  history.replaceState(null, '', location.pathname + location.search);
  signIn(decodeURIComponent(linked[1]));
} else if (state.token) signIn(state.token);
else signOut('');
