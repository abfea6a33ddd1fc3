// An endpoint that never got a delivery through, yet has no counted failure (headless Chromium via playwright-core,
// against `hookline dev`; run by scripts/test-portal after portal.spec.mjs). Under LuciBook a 429 is retried without
// counting toward disablement, so an endpoint that answers every delivery with 429 (the dev receiver's /throttled)
// keeps no failure count: the list must not show it green "healthy" with "last success never", but "waiting".

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, api, launch, required, until } from './harness.mjs';

const RECEIVER = required('HOOKLINE_RECEIVER');
const RUN = Date.now().toString(36);
const TENANT = { id: `wait-${RUN}`, name: `Waiting ${RUN}` };
const TYPE = `hw${RUN}.ping`;

let browser;
let page;
let sub;

before(async () => {
  browser = await launch('health');
  page = browser.page;
});

after(async () => {
  if (sub) await api('DELETE', `/v1/subscriptions/${sub}`);
  await browser?.close();
});

test('an endpoint whose every delivery waits on 429', async (t) => {
  await t.test('a LuciBook subscription to an endpoint that always answers 429, and an event for it', async () => {
    assert.equal((await api('POST', '/v1/tenants', TENANT)).status, 201);
    const s = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/throttled`, event_types: [TYPE], policy: 'lucibook', tenant: TENANT.id });
    assert.equal(s.status, 201, JSON.stringify(s.body));
    sub = s.body.id;
    const ev = await api('POST', '/v1/events', { id: `evt_${RUN}`, type: TYPE, tenant: TENANT.id, data: { n: 1 } });
    assert.equal(ev.status, 202, JSON.stringify(ev.body));
    // The 429 is in the log, the delivery pending, and the API counts no failure.
    await until('the 429 in the delivery log', async () => {
      const r = await api('GET', `/v1/subscriptions/${sub}/deliveries`);
      return r.body.items.some((d) => d.last_attempt && d.last_attempt.http_status === 429);
    });
    const now = (await api('GET', `/v1/subscriptions/${sub}`)).body;
    assert.equal(now.consecutive_failures, 0, JSON.stringify(now));
  });

  await t.test('the list says it is waiting, not healthy', async () => {
    const link = await api('POST', `/v1/tenants/${TENANT.id}/portal-links`, {});
    assert.equal(link.status, 201, JSON.stringify(link.body));
    await page.goto('about:blank');
    await page.goto(link.body.url);
    const badge = page.locator(`#subs tr[data-sub="${sub}"] [data-testid=health]`);
    await badge.waitFor();
    assert.equal(await badge.getAttribute('data-health'), 'waiting');
    assert.match(await badge.textContent(), /^waiting · 1 retrying$/);
    assert.match(await badge.getAttribute('title'), /429/);
    assert.ok(page.url().startsWith(API), page.url());
    assert.deepEqual(browser.pageErrors, []);
  });
});
