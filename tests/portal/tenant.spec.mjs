// The portal as an app hands it to its customers: opened through a tenant's portal link, in headless Chromium
// (Debian's /usr/bin/chromium, driven by playwright-core), against the `hookline dev` that scripts/test-portal starts
// (which passes HOOKLINE_API, HOOKLINE_RECEIVER, HOOKLINE_TOKEN and PORTAL_SCREENSHOT).
//
// Two tenants, A and B, each with an endpoint (A also one that always fails), made through the API with the admin
// token under names unique to this run. A's link shows A's endpoints and never B's, not even with B's subscription id
// put into the address; the failing endpoint says "failing"; a read-only link offers nothing it may not do and the
// API refuses a write made with it anyway; an expired link lands on its own screen; at 420 px nothing scrolls
// sideways; deleting an endpoint asks first and takes it off the list.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, TOKEN, WAIT, api, launch, required, until } from './harness.mjs';

const RECEIVER = required('HOOKLINE_RECEIVER');
const SCREENSHOT = (process.env.PORTAL_SCREENSHOT || 'target/portal-screenshot.png').replace(/\.png$/, '-tenant.png');
// Names of this run only: the dev server may hold what earlier specs made.
const RUN = Date.now().toString(36);
const A = { id: `alpha-${RUN}`, name: `Alpha ${RUN}` };
const B = { id: `beta-${RUN}`, name: `Beta ${RUN}` };
const TYPE = `tn${RUN}.ping`;

let browser;
let page;

before(async () => {
  // The refused calls this story makes on purpose (expired link 401, read-only 403, tampered id 404).
  browser = await launch('portal-tenant', { expected: /status of (401|403|404)/, viewport: { width: 1280, height: 900 } });
  page = browser.page;
});

after(async () => {
  await browser?.close();
});

async function must(status, method, path, body, token) {
  const r = await api(method, path, body, token);
  assert.equal(r.status, status, `${method} ${path}: ${JSON.stringify(r.body)}`);
  return r.body;
}

async function link(tenant, opts = {}) {
  return must(201, 'POST', `/v1/tenants/${tenant}/portal-links`, opts);
}

/// Opens a portal link in `p` from a blank page, so the page starts afresh with the link's token.
async function open(p, url) {
  await p.goto('about:blank');
  await p.goto(url);
}

const tokenOf = (l) => decodeURIComponent(l.url.split('#token=')[1]);
const noSideways = (p) => p.evaluate(() => ({ scroll: document.documentElement.scrollWidth, inner: window.innerWidth }));

test('the portal through a tenant’s portal link', async (t) => {
  const subs = {};

  await t.test('setup: two tenants with an endpoint each, and a failing one for A', async () => {
    for (const x of [A, B]) await must(201, 'POST', '/v1/tenants', x);
    const make = async (key, tenant, path, description) => {
      const s = await must(201, 'POST', '/v1/subscriptions', {
        url: `${RECEIVER}/${path}?endpoint=${key}-${RUN}`, event_types: [`tn${RUN}.*`], tenant, description,
      });
      subs[key] = s;
    };
    await make('a', A.id, 'ok', `alpha endpoint ${RUN}`);
    await make('afail', A.id, 'failing', `alpha failing endpoint ${RUN}`);
    await make('adel', A.id, 'ok', `alpha endpoint to delete ${RUN}`);
    await make('b', B.id, 'ok', `beta endpoint ${RUN}`);
    for (const x of [A, B]) {
      await must(202, 'POST', '/v1/events', { id: `evt_${x.id}`, type: TYPE, tenant: x.id, data: { n: 1 } });
    }
  });

  await t.test('a portal link for A shows A’s name and endpoints, and none of B’s', async () => {
    const l = await link(A.id);
    assert.match(l.url, /\/portal\/#token=hlp_/);
    await open(page, l.url);
    await page.getByRole('heading', { name: `Endpoints of ${A.name}` }).waitFor();
    assert.equal((await page.locator('#who [data-testid=tenant]').textContent()).trim(), A.name);
    assert.equal(new URL(page.url()).hash, '', 'the token is taken out of the address');
    for (const k of ['a', 'afail', 'adel']) await page.locator(`#subs tr[data-sub="${subs[k].id}"]`).waitFor();
    const text = await page.locator('main').textContent();
    assert.ok(!text.includes(`b-${RUN}`) && !text.includes(`beta endpoint ${RUN}`), 'B’s endpoint is not listed');
    assert.equal(await page.locator(`#subs tr[data-sub="${subs.b.id}"]`).count(), 0);
    // A tenant's link offers no admin-only action and says it may write.
    assert.equal(await page.locator('[data-testid=read-only]').count(), 0);
    assert.ok(await page.locator('#btn-create').isVisible(), 'a writable link may create');
  });

  await t.test('the failing endpoint shows "failing", the healthy one its 24 h success rate', async () => {
    const failing = page.locator(`#subs tr[data-sub="${subs.afail.id}"] [data-testid=health]`);
    await until('the failing badge', async () => (await failing.getAttribute('data-health')) === 'failing');
    assert.match(await failing.textContent(), /^failing · \d+ in a row$/);
    const healthy = page.locator(`#subs tr[data-sub="${subs.a.id}"]`);
    assert.equal(await healthy.locator('[data-testid=health]').getAttribute('data-health'), 'healthy');
    await healthy.locator('[data-testid=success-rate]', { hasText: '100 %' }).waitFor();
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  });

  await t.test('B’s subscription id in A’s portal address shows not-found, never B’s data', async () => {
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subs.b.id)}`);
    await page.getByRole('heading', { name: 'No such subscription' }).waitFor();
    await page.locator('[data-testid=not-found]').waitFor();
    const text = await page.locator('main').innerText();
    assert.ok(!text.includes(`b-${RUN}`) && !text.includes(`beta endpoint ${RUN}`), `nothing of B is shown: ${text}`);
    assert.equal(await page.locator('#log tr[data-delivery]').count(), 0, 'no delivery log');
    assert.equal(await page.locator('#btn-pause').isVisible(), false, 'no actions on what is not found');
    // The API behind it answers A's link with 404 for everything of B's.
    const token = tokenOf(await link(A.id));
    for (const path of ['', '/deliveries', '/stats']) {
      assert.equal((await api('GET', `/v1/subscriptions/${subs.b.id}${path}`, undefined, token)).status, 404, path);
    }
    assert.equal((await api('POST', `/v1/subscriptions/${subs.b.id}/pause`, undefined, token)).status, 404);
    // Back to A's own endpoint: shown as usual.
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subs.a.id)}`);
    await page.locator('#sub-title', { hasText: `a-${RUN}` }).waitFor();
    await page.locator('#btn-delete').waitFor();
  });

  await t.test('at 420 px nothing scrolls sideways and the controls stay reachable', async () => {
    await page.setViewportSize({ width: 420, height: 860 });
    await page.goto(`${API}/portal/#/`);
    await page.locator(`#subs tr[data-sub="${subs.afail.id}"]`).waitFor();
    let w = await noSideways(page);
    assert.ok(w.scroll <= w.inner, `the list is ${w.scroll} px wide in a ${w.inner} px window`);
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subs.afail.id)}`);
    await page.locator('#sub-title', { hasText: `afail-${RUN}` }).waitFor();
    await page.locator('#log tr[data-delivery]').first().waitFor();
    await page.locator('#chart svg').first().waitFor();
    // The chart fits its data (a minute old) rather than spanning the day: "between HH:MM–HH:MM", minutes apart.
    const summary = await until('the chart to draw the attempt', async () => {
      const text = await page.locator('.chart-summary').textContent();
      return /^\d+ attempts? between/.test(text) && text;
    });
    const period = summary.match(/between (\d\d):(\d\d)–(\d\d):(\d\d)/);
    assert.ok(period, summary);
    const minutes = (Number(period[3]) * 60 + Number(period[4]) - Number(period[1]) * 60 - Number(period[2]) + 1440) % 1440;
    assert.ok(minutes <= 15, `the chart spans ${minutes} minutes for data a minute old`);
    w = await noSideways(page);
    assert.ok(w.scroll <= w.inner, `the detail is ${w.scroll} px wide in a ${w.inner} px window`);
    const controls = ['#btn-pause', '#btn-edit', '#btn-delete', '#refresh', '#sign-out', '#chart-range', '#log button[aria-expanded]'];
    for (const sel of controls) {
      const box = await page.locator(sel).first().boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= w.inner, `${sel} is within the window: ${JSON.stringify(box)}`);
    }
    await page.screenshot({ path: SCREENSHOT.replace(/\.png$/, '-420.png'), fullPage: true });
  });

  await t.test('deleting an endpoint asks first, then it is gone from the list', async () => {
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subs.adel.id)}`);
    await page.locator('#sub-title', { hasText: `adel-${RUN}` }).waitFor();
    await page.locator('#btn-delete').click();
    const dialog = page.locator('#confirm-dialog[open]');
    await dialog.waitFor();
    // Cancel first: nothing is deleted.
    await page.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'detached' });
    assert.equal((await api('GET', `/v1/subscriptions/${subs.adel.id}`)).status, 200, 'cancel deletes nothing');
    await page.locator('#btn-delete').click();
    await dialog.waitFor();
    await page.getByRole('button', { name: 'Delete', exact: true }).click();
    await page.locator('#list-result', { hasText: 'Deleted' }).waitFor();
    await page.locator(`#subs tr[data-sub="${subs.a.id}"]`).waitFor();
    // Gone at once: the list it returns to does not show it, even before that list is fetched again.
    assert.equal(await page.locator(`#subs tr[data-sub="${subs.adel.id}"]`).count(), 0, 'gone from the list');
    assert.equal((await api('GET', `/v1/subscriptions/${subs.adel.id}`)).status, 404);
    await page.setViewportSize({ width: 1280, height: 900 });
  });

  await t.test('a read-only link shows no mutating control, and a write made with it is refused', async () => {
    const l = await link(A.id, { read_only: true });
    assert.equal(l.read_only, true);
    await open(page, l.url);
    await page.getByRole('heading', { name: `Endpoints of ${A.name}` }).waitFor();
    await page.locator('#who [data-testid=read-only]').waitFor();
    await page.locator(`#subs tr[data-sub="${subs.a.id}"]`).waitFor();
    const mutating = /New subscription|Create the first one|Resume|Enable|Pause|Edit|Rotate|Delete|Replay|Redrive/;
    const visible = async () => {
      const names = await page.locator('button:visible').allTextContents();
      return names.filter((n) => mutating.test(n));
    };
    assert.deepEqual(await visible(), [], 'the list offers no write');
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subs.a.id)}`);
    await page.locator('#sub-title', { hasText: `a-${RUN}` }).waitFor();
    await page.locator('#log tr[data-delivery]').first().waitFor();
    assert.deepEqual(await visible(), [], 'the detail offers no write');
    assert.ok(await page.getByRole('button', { name: 'Attempts' }).first().isVisible(), 'reading still works');
    // A write made anyway, from the page with its own credential: 403, and nothing changed.
    const refused = await page.evaluate(async (id) => {
      const token = sessionStorage.getItem('hookline.portal.token');
      const r = await fetch(`/v1/subscriptions/${id}/pause`, { method: 'POST', headers: { authorization: `Bearer ${token}` } });
      return { status: r.status, body: await r.json() };
    }, subs.a.id);
    assert.equal(refused.status, 403, JSON.stringify(refused.body));
    assert.equal(refused.body.error.code, 'forbidden');
    assert.equal((await api('GET', `/v1/subscriptions/${subs.a.id}`)).body.state, 'active', 'not paused');
  });

  await t.test('a read-only link opened in the tab where the admin is signed in becomes the tenant’s view', async () => {
    // The admin signs in by a dev link; the tenant's link then arrives in the same tab, changing only the hash
    // (pasted into the address bar, or followed from another page of the portal): no page load.
    await open(page, `${API}/portal/#token=${encodeURIComponent(TOKEN)}`);
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    await page.locator('#who .who-tenant', { hasText: 'admin' }).waitFor();
    await page.locator('#subs tr[data-sub]').first().waitFor();
    // The admin sees whose each subscription is.
    await page.getByRole('columnheader', { name: 'Tenant' }).waitFor();
    const loads = await page.evaluate(() => performance.getEntriesByType('navigation').length);
    const l = await link(A.id, { read_only: true });
    await page.evaluate((hash) => { location.hash = hash; }, new URL(l.url).hash);
    await page.getByRole('heading', { name: `Endpoints of ${A.name}` }).waitFor();
    await page.locator('#who [data-testid=read-only]').waitFor();
    assert.equal((await page.locator('#who [data-testid=tenant]').textContent()).trim(), A.name);
    await page.locator(`#subs tr[data-sub="${subs.a.id}"]`).waitFor();
    assert.equal(await page.locator(`#subs tr[data-sub="${subs.b.id}"]`).count(), 0, 'the admin’s list is gone');
    assert.equal(await page.getByRole('columnheader', { name: 'Tenant' }).count(), 0, 'a tenant needs no tenant column');
    assert.equal(new URL(page.url()).hash, '', 'the token is taken out of the address');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('hookline.portal.token')), tokenOf(l), 'the link’s session replaced the admin’s');
    assert.equal(await page.evaluate(() => performance.getEntriesByType('navigation').length), loads, 'no page load');
  });

  await t.test('an expired link lands on "this link has expired", not a sign-in form or a generic error', async () => {
    const l = await link(A.id, { ttl_s: 1 });
    await until('the link to expire', async () => Date.now() > l.expires_at_ms + 200, 10_000);
    await open(page, l.url);
    await page.getByRole('heading', { name: 'This link has expired' }).waitFor();
    await page.getByText('ask for a new one').first().waitFor();
    assert.equal(await page.locator('#signin-view').isVisible(), false, 'no sign-in form');
    assert.equal(await page.locator('#session').isVisible(), false);
    assert.equal(await page.locator(`#subs tr[data-sub="${subs.a.id}"]`).isVisible(), false, 'nothing of the tenant');
    // The API says why in its code, so the page need not guess.
    const r = await api('GET', '/v1/whoami', undefined, tokenOf(l));
    assert.deepEqual([r.status, r.body.error.code], [401, 'link_expired']);
  });

  await t.test('no script error and no content-security-policy violation', () => {
    assert.deepEqual(browser.pageErrors, []);
  });
});
