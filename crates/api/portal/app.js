// The hookline portal: subscriptions, their delivery log, resume, replay and redrive, over the ingest's JSON API
// with the bearer token the user typed (kept in sessionStorage). Plain ES module, no framework, no build step.

import { renderChart } from './chart.js';

const TOKEN_KEY = 'hookline.portal.token';
const REFRESH_MS = 3000;
const PAGE = 25;
/// From this far behind Kafka the delivery log says so above its list (the page's `history.behind_ms`).
const LAG_SHOWN_MS = 5000;

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
  who: null, // GET /v1/whoami: what the credential is (tenant mode, read-only)
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
/// Local time with its offset from UTC, so a time read aloud or pasted elsewhere is not ambiguous.
function fmtTime(ms) {
  if (!ms) return '–';
  const d = new Date(ms);
  const off = -d.getTimezoneOffset();
  const zone = off === 0 ? 'UTC' : `UTC${off > 0 ? '+' : '−'}${pad2(Math.floor(Math.abs(off) / 60))}:${pad2(Math.abs(off) % 60)}`;
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())} ${zone}`;
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
    const code = await resp.json().then((d) => (d && d.error ? d.error.code : null), () => null);
    refused(code);
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
  state.who = null;
  applyWho(null);
  sessionStorage.removeItem(TOKEN_KEY);
  stopTimer();
  show('signin');
  $('session').hidden = true;
  $('signin-error').textContent = message || '';
  $('token').value = '';
  $('token').focus();
}

/// `resumed`: the token is the one this tab kept (a reload), not one just typed or linked.
async function signIn(token, resumed = false) {
  state.token = token;
  state.who = null;
  state.resumed = resumed;
  try {
    state.who = await api('GET', '/v1/whoami');
  } catch (e) {
    if (!(e instanceof AuthError)) $('signin-error').textContent = `Could not sign in: ${describe(e)}.`;
    state.token = '';
    return;
  }
  applyWho(state.who);
  sessionStorage.setItem(TOKEN_KEY, token);
  $('signin-error').textContent = '';
  $('session').hidden = false;
  route(true);
}

// ---------- tenant mode ----------

const isLinkToken = (t) => t.startsWith('hlp_');

/// A 401: a portal link that expired or is not valid gets its own screen (its user has no token to type); any other
/// credential goes back to the sign-in form.
function refused(code) {
  const link = isLinkToken(state.token);
  if (code === 'link_expired' || link) {
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    stopTimer();
    applyWho(null);
    $('session').hidden = true;
    const expired = code === 'link_expired';
    $('link-h').textContent = expired ? 'This link has expired' : 'This link is not valid';
    $('link-msg').textContent = expired
      ? 'This link has expired — ask for a new one from the app that gave it to you.'
      : 'This link is not valid (it was altered, or its account no longer exists) — ask for a new one.';
    document.title = `${$('link-h').textContent} — hookline portal`;
    show('link');
    $('link-h').setAttribute('tabindex', '-1');
    $('link-h').focus();
    return;
  }
  // A token that the server never issued (mistyped, or cut when pasted) and one that expired read alike to it.
  signOut(state.who || state.resumed ? 'your session ended: the token expired or was revoked' : 'not a valid token: check it and try again');
}

/// Shows what the credential is scoped to, and hides what it may not do: every control marked `mutates` is hidden
/// for a read-only link (the API would refuse it with 403).
function applyWho(who) {
  const readOnly = Boolean(who && !who.can_write);
  document.body.classList.toggle('read-only', readOnly);
  document.body.classList.toggle('tenant-mode', Boolean(who && who.tenant));
  $('list-h').textContent = who && who.tenant ? `Endpoints of ${who.tenant_name || who.tenant}` : 'Subscriptions';
  const badge = $('who');
  if (!who) {
    badge.replaceChildren();
    badge.hidden = true;
    return;
  }
  const parts = [];
  if (who.tenant) {
    parts.push(h('span', { class: 'who-tenant', 'data-testid': 'tenant', title: `tenant ${who.tenant}` }, who.tenant_name || who.tenant));
  } else {
    parts.push(h('span', { class: 'who-tenant' }, 'admin'));
  }
  if (readOnly) parts.push(h('span', { class: 'badge who-ro', 'data-testid': 'read-only' }, 'read-only'));
  if (who.expires_at_ms) {
    // The time alone when it is today, the date too when later (a link lives up to 7 days).
    const at = fmtTime(who.expires_at_ms);
    const today = at.slice(0, 10) === fmtTime(Date.now()).slice(0, 10);
    parts.push(h('span', { class: 'who-exp', title: at }, `link valid until ${today ? at.slice(11, 16) : at.slice(0, 16)}`));
  }
  badge.replaceChildren(...parts);
  badge.hidden = false;
}

// ---------- views ----------

function show(view) {
  state.view = view;
  for (const v of ['signin', 'list', 'detail', 'link', 'types']) $(`${v}-view`).hidden = v !== view;
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
    setResult($('te-result'), '');
  }
  state.subId = newId;
  if (!newId && location.hash === '#/event-types') {
    show('types');
  } else if (newId) {
    show('detail');
    if (!$('replay-since').value) $('replay-since').value = msToLocal(Date.now() - 3600e3);
  } else {
    show('list');
  }
  refresh().then(() => {
    if (focus) {
      const heading = state.view === 'types' ? $('types-h') : newId ? $('sub-title') : $('list-h');
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
        // Not another tenant's log or chart either when the subscription is not found.
        else if (state.view === 'detail' && (await loadSub())) await Promise.all([loadTestEventPanel(), loadLog(), loadChart()]);
        else if (state.view === 'types') await loadEventTypes();
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
  const page = await api('GET', `/v1/subscriptions${q({ limit: PAGE, after, include: 'success_24h' })}`);
  state.subsNext = page.next_after;
  $('subs-prev').disabled = state.subsCursor.length <= 1;
  $('subs-next').disabled = !page.next_after;
  // What each row shows, so an unchanged list is not drawn again.
  renderPart('subs', page.items.map(listed), $('subs'), () => {
    if (page.items.length === 0) {
      return h('p', { class: 'empty' }, state.who && state.who.tenant ? 'No endpoints yet. ' : 'No subscriptions yet. ',
        h('button', { type: 'button', class: 'mutates', onclick: () => openSubDialog(null) }, 'Create the first one'));
    }
    // An admin sees every tenant's subscriptions: say whose each is. Newest first within the page (the API pages by id).
    const admin = !(state.who && state.who.tenant);
    const items = [...page.items].sort((a, b) => (b.created_at_ms || 0) - (a.created_at_ms || 0));
    const heads = ['Endpoint', ...(admin ? ['Tenant'] : []), 'Event types', 'Health', 'Success (24 h)', 'Last success'];
    return h('table', { class: 'table subs' },
      h('caption', { class: 'sr-only' }, 'Subscriptions, newest first'),
      h('thead', {}, h('tr', {}, ...heads.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, items.map((s) => h('tr', { 'data-sub': s.id },
        h('td', { 'data-label': 'Endpoint' }, h('a', { href: `#/subscriptions/${encodeURIComponent(s.id)}`, class: 'url', 'data-key': `sub-${s.id}` }, s.url),
          s.description ? h('div', { class: 'muted' }, s.description) : null),
        admin ? h('td', { 'data-label': 'Tenant', 'data-testid': 'tenant-cell' }, s.tenant || h('span', { class: 'muted' }, 'none')) : null,
        h('td', { 'data-label': 'Event types' }, s.event_types.join(', ')),
        h('td', { 'data-label': 'Health' }, healthBadge(s)),
        h('td', { 'data-label': 'Success (24 h)', class: 'num' }, successRate(s.success_24h)),
        h('td', { 'data-label': 'Last success', title: fmtTime(s.last_success_at_ms) }, s.last_success_at_ms ? ago(s.last_success_at_ms) : 'never'),
      ))));
  });
}

/// The parts of a list item the list shows.
function listed(s) {
  return [s.id, s.url, s.tenant, s.created_at_ms, s.description, s.event_types, s.health, s.state, s.disabled_reason, s.consecutive_failures, s.success_24h, s.last_success_at_ms];
}

const HEALTH_TITLES = {
  healthy: 'No failure since the last success',
  failing: 'Its recent attempts failed; deliveries are retried',
  paused: 'Nothing is sent until it is resumed; deliveries wait or are skipped as its policy says',
  disabled: 'Switched off; nothing is sent',
};

/// The endpoint's health at a glance (the API's `health`), with why it is switched off or how often it failed.
function healthBadge(s) {
  const health = s.health || 'healthy';
  // No counted failure, yet nothing got through: every delivery waits on retries its policy does not count (LuciBook's
  // 429s). Green "healthy" with "last success never" would mislead: say it is waiting.
  const x = s.success_24h;
  if (health === 'healthy' && !s.last_success_at_ms && x && x.pending > 0 && x.succeeded === 0) {
    return h('span', { class: 'badge h-failing', 'data-testid': 'health', 'data-health': 'waiting',
      title: 'No delivery has succeeded yet; its deliveries are being retried (answers its policy does not count as failures, such as 429)' },
      `waiting · ${x.pending} retrying`);
  }
  let detail = '';
  if (health === 'failing') detail = ` · ${s.consecutive_failures} in a row`;
  else if (s.disabled_reason) detail = ` · ${s.disabled_reason}`;
  else if (s.state === 'pending_verification') detail = ' · awaiting verification';
  return h('span', { class: `badge h-${health}`, 'data-testid': 'health', 'data-health': health, title: HEALTH_TITLES[health] || '' }, `${health}${detail}`);
}

/// `success_24h` in words: the share of ended deliveries that succeeded, and of how many.
function successRate(x) {
  if (!x) return h('span', { class: 'muted', title: 'The delivery log did not answer' }, '–');
  const ended = x.succeeded + x.failed;
  const pending = x.pending ? h('div', { class: 'muted' }, `${x.pending} retrying`) : null;
  if (x.rate == null) return h('span', { 'data-testid': 'success-rate' }, h('span', { class: 'muted' }, ended === 0 && !x.pending ? 'no deliveries' : '–'), pending);
  const pct = x.rate * 100;
  const text = pct === 100 || pct === 0 ? `${pct} %` : `${pct.toFixed(1)} %`;
  const cls = pct >= 99 ? 'r-good' : pct >= 90 ? 'r-warn' : 'r-bad';
  return h('span', { 'data-testid': 'success-rate', title: `${x.succeeded} of ${ended} ended deliveries succeeded in the last 24 h` },
    h('span', { class: `rate ${cls}` }, text), h('div', { class: 'muted' }, `of ${ended}`), pending);
}

// ----- one subscription -----

/// The subscription's facts and state; false when it is not found (none with this id, or another tenant's: the
/// API answers both alike), and then only that is shown.
async function loadSub() {
  let sub;
  try {
    sub = await api('GET', `/v1/subscriptions/${encodeURIComponent(state.subId)}`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) {
      state.sub = null;
      state.lastRender.clear();
      $('detail-view').classList.add('not-found');
      $('sub-title').textContent = 'No such subscription';
      document.title = 'Not found — hookline portal';
      $('sub-state').replaceChildren();
      $('sub-facts').replaceChildren(h('div', { 'data-testid': 'not-found' }, h('dt', {}, 'Not found'), h('dd', {}, `${describe(e)}. It may have been deleted, or the address is wrong.`)));
      return false;
    }
    throw e;
  }
  $('detail-view').classList.remove('not-found');
  state.sub = sub;
  $('sub-title').textContent = sub.url;
  document.title = `${sub.url} — hookline portal`;
  renderPart('sub-state', [sub.state, sub.disabled_reason, sub.enabled, sub.circuit_breaker && sub.circuit_breaker.state, sub.health, sub.consecutive_failures], $('sub-state'), () => [healthBadge(sub), ' ', stateBadge(sub)]);
  const facts = [
    ['ID', sub.id],
    ['Event types', sub.event_types.join(', ')],
    ['Policy', sub.policy + (sub.policy_error ? ` — invalid: ${sub.policy_error}` : '')],
    ['State', sub.disabled_reason ? `${sub.state}: ${sub.disabled_reason}` : sub.state],
    ['Verification', sub.verification_error ? `${sub.verification}: ${sub.verification_error}` : (sub.verification || 'not_required')],
    ['Rate limit', sub.rate_limit ? `${sub.rate_limit.per_s}/s, burst ${sub.rate_limit.burst}` : 'none'],
    ['Ordering', orderingFact(sub)],
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
  return true;
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
  showLag(page.history);
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
      h('thead', {}, h('tr', {}, ...['Event', 'Event type', 'State', 'Attempts', 'Last attempt', 'Actions'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, shown.map(([d, att]) => logRows(d, att))));
  });
}

/// The log's indexer trails Kafka (a flood, a slow store): the newest deliveries may be missing from the list.
function showLag(history) {
  const behind = history ? history.behind_ms : 0;
  const el = $('log-lag');
  el.hidden = behind < LAG_SHOWN_MS;
  el.textContent = el.hidden ? '' : `History is ${behind >= 120000 ? `${Math.round(behind / 60000)} min` : `${Math.round(behind / 1000)} s`} behind: deliveries newer than that may not be listed yet.`;
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
    h('td', {}, h('code', { class: 'id', title: `delivery ${d.delivery_id}` }, d.event_id || d.delivery_id)),
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
      d.replayable ? h('button', { type: 'button', class: 'mutates', 'data-key': `replay-${d.delivery_id}`, onclick: () => replayOne(d) }, 'Replay…') : null));
  if (!open) return [row];
  let body;
  if (!att) body = h('p', {}, 'Loading…');
  else if (att.error) body = h('p', { class: 'error' }, att.error);
  else {
    body = [eventBody(att.entry), attemptsTable(att.entry, `Attempts of ${d.event_id} (${att.entry.attempts.length} kept)`)];
  }
  return [row, h('tr', { class: 'attempts-row', id: panelId }, h('td', { colspan: 6 }, body))];
}

// ----- attempt detail (shared by the subscription's log and the event search) -----

/// The event the requests carried, while the delivery log keeps it: its `data`, which the request body wraps in the
/// policy's envelope (the event's id, type and time beside it), so it is labelled as the data, not as the body.
function eventBody(entry) {
  if (!entry.event) return h('p', { class: 'muted' }, 'The event is no longer kept (older than the log\'s retention).');
  return h('details', { class: 'event-body', 'data-key': `ev-${entry.delivery_id}` },
    h('summary', {}, `Event data: ${entry.event.id} (${entry.event.type}), sent as the request body's "data"`),
    h('pre', { class: 'excerpt', 'data-testid': 'event-data' }, JSON.stringify(entry.event.data, null, 2)));
}

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
    eventBody(d),
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

// "Fit to the data": the last 24 h are looked at in 5-minute buckets (288 of them), then the span from the first to the last
// bucket with attempts is drawn again in buckets of a size that gives it about 60 bars.
const FIT_LOOKBACK_MS = 86400e3;
const FIT_PROBE_BUCKET_MS = 300e3;
const FIT_BUCKETS_MS = [1e3, 2e3, 5e3, 10e3, 15e3, 30e3, 60e3, 120e3, 300e3, 600e3, 900e3, 1800e3];

/// [since_ms, until_ms, bucket_ms] of the stats to draw: a fixed window from the select, or the data's own range.
async function chartWindow(subPath) {
  const choice = $('chart-range').value;
  const now = Date.now();
  if (choice !== 'fit') {
    const [span, bucket] = choice.split(':').map(Number);
    return [now - span, undefined, bucket];
  }
  const probe = await api('GET', `${subPath}/stats${q({ since_ms: now - FIT_LOOKBACK_MS, bucket_ms: FIT_PROBE_BUCKET_MS })}`);
  const busy = probe.buckets.filter((b) => b.attempts > 0);
  if (busy.length === 0) return [now - 3600e3, undefined, 60e3];
  // From the first busy bucket to the end of the last one (or now).
  let first = busy[0].start_ms;
  let last = Math.min(busy[busy.length - 1].start_ms + FIT_PROBE_BUCKET_MS, now);
  if (last - first <= 2 * FIT_PROBE_BUCKET_MS) {
    // A few minutes at most (a new endpoint's first burst): find where in them the attempts are, in 5 s buckets, so
    // the burst is drawn across the chart rather than squeezed against its right edge.
    const fine = await api('GET', `${subPath}/stats${q({ since_ms: first, until_ms: last, bucket_ms: 5e3 })}`);
    const hits = fine.buckets.filter((b) => b.attempts > 0);
    if (hits.length > 0) {
      first = hits[0].start_ms;
      last = Math.min(hits[hits.length - 1].start_ms + 5e3, now);
    }
  }
  // At least a minute; a little room on either side of the data.
  const span = Math.max(last - first, 60e3) * 1.2;
  const bucket = FIT_BUCKETS_MS.find((b) => span / b <= 60) || FIT_PROBE_BUCKET_MS;
  // The probe's buckets are coarse: start one fine bucket before the first, so its first bars are not cut.
  const until = last >= now - FIT_PROBE_BUCKET_MS ? undefined : last;
  return [Math.max(first - bucket, now - FIT_LOOKBACK_MS), until, bucket];
}

async function loadChart() {
  const subPath = `/v1/subscriptions/${encodeURIComponent(state.subId)}`;
  const [since, until, bucket] = await chartWindow(subPath);
  const stats = await api('GET', `${subPath}/stats${q({ since_ms: since, until_ms: until, bucket_ms: bucket })}`);
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

/// Deletes the endpoint after a confirmation, then goes back to the list, which says so.
async function deleteSub() {
  const sub = state.sub;
  if (!sub) return;
  const ok = await confirmDialog({
    title: 'Delete this endpoint?',
    body: `${sub.url} stops receiving events at once, and its subscription cannot be restored. Its delivery log is kept until it ages out.`,
    ok: 'Delete',
  });
  if (!ok) return;
  setResult($('action-result'), 'Deleting…', 'busy');
  try {
    await api('DELETE', `/v1/subscriptions/${encodeURIComponent(sub.id)}`);
  } catch (e) {
    if (!(e instanceof AuthError)) {
      const text = `Failed: ${describe(e)}`;
      setResult($('action-result'), text, 'error');
      announce(text);
    }
    return;
  }
  const text = `Deleted ${sub.url}.`;
  state.lastRender.clear();
  // The list view still holds the rows it last drew: this one goes now, not when the list is fetched again.
  document.querySelector(`#subs tr[data-sub="${CSS.escape(sub.id)}"]`)?.remove();
  location.hash = '#/';
  setResult($('list-result'), text, 'ok');
  announce(text);
}

// ---------- event types and test events ----------

/// Whether a subscription's event-type pattern (`*`, `order.*` or exact) matches `type`, as the fan-out decides.
function typeMatches(pattern, type) {
  if (pattern === '*') return true;
  if (pattern.endsWith('.*')) return type.length > pattern.length - 1 && type.startsWith(pattern.slice(0, -1));
  return pattern === type;
}

const shortJson = (v, max = 200) => {
  const t = JSON.stringify(v);
  return t.length > max ? `${t.slice(0, max)}…` : t;
};

/// The whole catalogue (it holds at most 1000 types), page by page.
async function fetchEventTypes() {
  const items = [];
  let after = null;
  do {
    const page = await api('GET', `/v1/event-types${q({ limit: 500, after })}`);
    items.push(...page.items);
    after = page.next_after;
  } while (after);
  return items;
}

async function loadEventTypes() {
  const items = await fetchEventTypes();
  renderPart('event-types', items, $('event-types'), () => {
    if (items.length === 0) return h('p', { class: 'empty' }, 'No event types are catalogued yet.');
    return h('table', { class: 'table', 'data-testid': 'event-types' },
      h('caption', { class: 'sr-only' }, 'Event types'),
      h('thead', {}, h('tr', {}, ...['Event type', 'Description', 'Schema', 'Example'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, items.map((t) => h('tr', { 'data-event-type': t.name },
        h('td', {}, h('code', {}, t.name)),
        h('td', {}, t.description || h('span', { class: 'muted' }, '–')),
        h('td', {}, t.schema ? `yes (${t.effective_validation})` : 'no'),
        h('td', {}, t.examples.length ? h('code', { class: 'excerpt' }, shortJson(t.examples[0])) : h('span', { class: 'muted' }, 'none'))))));
  });
}

/// The subscription's catalogued types that have an example, for the Send test event form.
async function loadTestEventPanel() {
  const sub = state.sub;
  if (!sub || sub.id !== state.subId) return;
  const types = (await fetchEventTypes()).filter((t) => t.examples.length && sub.event_types.some((p) => typeMatches(p, t.name)));
  state.testTypes = new Map(types.map((t) => [t.name, t]));
  renderPart('test-event', types.map((t) => [t.name, t.examples[0]]), $('te-type'), () => types.map((t) => h('option', { value: t.name }, t.name)));
  const none = types.length === 0;
  $('btn-test-event').disabled = none;
  $('te-type').disabled = none;
  const chosen = state.testTypes.get($('te-type').value);
  $('te-example').textContent = none ? 'None of this subscription’s event types has an example in the catalogue.' : chosen ? JSON.stringify(chosen.examples[0], null, 2) : '';
}

/// Sends the chosen type's first example to this subscription, then follows its delivery until the attempt is in.
async function sendTestEvent(ev) {
  ev.preventDefault();
  const type = $('te-type').value;
  const subId = state.subId;
  if (!type) return;
  const out = $('te-result');
  setResult(out, 'Sending…', 'busy');
  let r;
  try {
    r = await api('POST', `/v1/subscriptions/${encodeURIComponent(subId)}/test-event`, { event_type: type, example: 0 });
  } catch (e) {
    if (!(e instanceof AuthError)) setResult(out, `Failed: ${describe(e)}`, 'error');
    return;
  }
  setResult(out, `Test event ${r.event_id} queued; waiting for the attempt…`, 'busy');
  // The delivery log trails the attempt by an indexer batch: ask until it has a final state (bounded).
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline && state.subId === subId) {
    await new Promise((res) => setTimeout(res, 500));
    let d;
    try {
      d = await api('GET', `/v1/deliveries/${encodeURIComponent(r.delivery_id)}`);
    } catch (e) {
      if (e instanceof AuthError) return;
      continue; // 404 until the log has indexed it
    }
    const last = d.attempts && d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
    if (!last) continue;
    const text = `Test event ${r.event_id}: ${d.state} · ${attemptResult(last)} · ${fmtDur(last.duration_ms)}`;
    if (d.state === 'pending') {
      setResult(out, `${text} (retrying)`, 'busy');
      continue;
    }
    setResult(out, text, d.state === 'succeeded' ? 'ok' : 'error');
    announce(text);
    state.lastRender.delete('log');
    refresh();
    return;
  }
  if (state.subId === subId) setResult(out, `Test event ${r.event_id}: no attempt yet; see the delivery log.`, 'error');
}

function wireCatalogue() {
  $('test-event-form').addEventListener('submit', sendTestEvent);
  $('te-type').addEventListener('change', () => {
    const t = state.testTypes && state.testTypes.get($('te-type').value);
    $('te-example').textContent = t ? JSON.stringify(t.examples[0], null, 2) : '';
  });
}

// ---------- wiring ----------

function wire() {
  wireCatalogue();
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
  // A portal link opened in a tab where the portal already runs changes only the address's hash: its token
  // replaces the session (an admin who opens a tenant's read-only link sees what the tenant sees).
  window.addEventListener('hashchange', () => {
    const t = linkedToken();
    if (t !== null) switchTo(t);
    else route(true);
  });

  $('btn-create').addEventListener('click', () => openSubDialog(null));
  $('subs-next').addEventListener('click', () => { if (state.subsNext) { state.subsCursor.push(state.subsNext); refresh(); } });
  $('subs-prev').addEventListener('click', () => { if (state.subsCursor.length > 1) { state.subsCursor.pop(); refresh(); } });

  $('btn-resume').addEventListener('click', resume);
  $('btn-pause').addEventListener('click', pause);
  $('btn-edit').addEventListener('click', () => state.sub && openSubDialog(state.sub));
  $('btn-rotate').addEventListener('click', rotate);
  $('btn-delete').addEventListener('click', deleteSub);
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

/// `hookline dev` and the portal-links API give links ending in `#token=...` that sign in at once. The token is
/// taken out of the address straight away, so it is neither kept in the history nor sent on in a Referer. `null`
/// when the address has none.
function linkedToken() {
  const linked = location.hash.match(/^#token=([^&]+)$/);
  if (!linked) return null;
  history.replaceState(null, '', location.pathname + location.search);
  return decodeURIComponent(linked[1]);
}

/// Ends the current session (its timer, its views' state, the stored token) and signs in with `token`.
function switchTo(token) {
  stopTimer();
  sessionStorage.removeItem(TOKEN_KEY);
  applyWho(null);
  state.who = null;
  state.subId = null;
  state.sub = null;
  state.subsCursor = [null];
  state.subsNext = null;
  state.logCursor = [null];
  state.logNext = null;
  state.expanded.clear();
  state.attempts.clear();
  state.lastRender.clear();
  signIn(token);
}

wire();
const linked = linkedToken();
if (linked !== null) signIn(linked);
else if (state.token) signIn(state.token, true);
else signOut('');

/// The subscription's delivery order in words: "none", "strict (one at a time)", "by entity_id", with the keys that
/// hold deliveries now.
function orderingFact(sub) {
  const mode = sub.ordering || 'none';
  if (mode === 'none') return 'none (concurrent)';
  const what = mode === 'strict' ? 'strict (one at a time)' : `by ${sub.ordering_key}`;
  const out = sub.ordering_keys_out || 0;
  return out > 0 ? `${what}; ${out} key${out === 1 ? '' : 's'} holding deliveries` : what;
}
