// The circuit breaker in the portal (headless Chromium via playwright-core, against `hookline dev`; run by
// scripts/test-portal after portal.spec.mjs). A subscription whose policy has a `[breaker]` points at a loopback port
// nobody listens on: two connect errors open its breaker, and the subscription's page says so ("circuit open
// until …") next to its state, while a healthy subscription's page shows no breaker. Both are deleted at the end.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { API, TOKEN, WAIT, api, launch, required, until } from './harness.mjs';

const RECEIVER = required('HOOKLINE_RECEIVER');
const TYPE = 'portalbreaker.ping';

// Retries every second; two connect errors in a row open the breaker for ten minutes (longer than this spec).
const POLICY = `
name = "portal-breaker"
description = "Retries every second; a breaker after two connect errors"
exhausted = "failed"
inactive = "hold"

[schedule]
waits_s = [1, 1, 1, 1, 1, 1, 1, 1]
max_attempts = 9

[attempt]
timeout_ms = 2000
response_cap_bytes = 4096

[[classify]]
when = ["2xx"]
verdict = "success"

[[classify]]
when = ["any"]
verdict = "retry"

[breaker]
consecutive_errors = 2
cool_off_ms = 600000
max_cool_off_ms = 600000

[request]
signature = "standard_webhooks"
signature_tolerance_s = 300
body_limit_bytes = 1048576
oversize = { action = "dead" }
`;

let browser;
let page;
const made = [];

/// A loopback port that was free a moment ago and is closed now: connecting to it is refused.
async function closedPort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

before(async () => {
  browser = await launch('breaker');
  page = browser.page;
});

after(async () => {
  for (const id of made) await api('DELETE', `/v1/subscriptions/${id}`);
  await browser?.close();
});

test('the breaker badge', async (t) => {
  let broken;
  let healthy;

  await t.test('two connect errors open the breaker of a subscription whose policy has one', async () => {
    const port = await closedPort();
    const b = await api('POST', '/v1/subscriptions', { url: `http://127.0.0.1:${port}/gone`, event_types: [TYPE], policy_toml: POLICY, description: 'breaker e2e' });
    assert.equal(b.status, 201, JSON.stringify(b.body));
    broken = b.body.id;
    made.push(broken);
    const h = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/ok`, event_types: [TYPE], description: 'breaker e2e healthy' });
    assert.equal(h.status, 201, JSON.stringify(h.body));
    healthy = h.body.id;
    made.push(healthy);
    for (const i of [1, 2]) {
      const ev = await api('POST', '/v1/events', { id: `evt_breaker_${Date.now()}_${i}`, type: TYPE, data: { n: i } });
      assert.equal(ev.status, 202, JSON.stringify(ev.body));
    }
    const sub = await until('the breaker is open', async () => {
      const r = await api('GET', `/v1/subscriptions/${broken}`);
      return r.body && r.body.circuit_breaker && r.body.circuit_breaker.state === 'open' ? r.body : null;
    });
    assert.ok(sub.circuit_breaker.open_until_ms > Date.now(), JSON.stringify(sub.circuit_breaker));
    // The breaker holds deliveries back; it switches nothing off.
    assert.equal(sub.state, 'active', JSON.stringify(sub));
  });

  await t.test("the subscription's page shows the open circuit next to its state", async () => {
    await page.goto(`${API}/portal/#token=${encodeURIComponent(TOKEN)}`);
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(broken)}`);
    await page.locator('#sub-title', { hasText: '/gone' }).waitFor();
    const badge = page.locator('#sub-state [data-testid=breaker]');
    await badge.waitFor({ timeout: WAIT });
    assert.match(await badge.textContent(), /^circuit open until /);
    assert.match(await badge.getAttribute('title'), /deliveries wait/);
    await page.locator('#sub-state [data-testid=state]', { hasText: 'active' }).waitFor();
  });

  await t.test("a healthy subscription's page shows no breaker", async () => {
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(healthy)}`);
    // The page has drawn this subscription (not still the one before).
    await page.locator('#sub-title', { hasText: `${RECEIVER}/ok` }).waitFor();
    await page.locator('#sub-state [data-testid=state]', { hasText: 'active' }).waitFor();
    assert.equal(await page.locator('#sub-state [data-testid=breaker]').count(), 0);
    assert.deepEqual(browser.pageErrors, []);
  });
});
