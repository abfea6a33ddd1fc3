// End-to-end test of the portal in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core),
// against a running `hookline dev` and its receiver. Run by scripts/test-portal, which starts hookline and passes
// HOOKLINE_API, HOOKLINE_RECEIVER, HOOKLINE_TOKEN, HOOKLINE_BIN and PORTAL_SCREENSHOT.
//
// The story: sign in; a subscription on a scaled-down LuciBook policy (one attempt per delivery, paused after 3
// counted failures) points at the receiver's /switch path, set to fail; three events fail and the subscription
// auto-pauses; the page shows the reason and the attempts (HTTP 500, response excerpt); the receiver is switched to
// ok, the subscription resumed with the keyboard, the failed deliveries replayed (replay since a time, through the
// confirmation dialog) and they become succeeded; the chart has bars of both outcomes.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, TOKEN, WAIT, api, launch, required, until } from './harness.mjs';
import { execFileSync } from 'node:child_process';

const RECEIVER = required('HOOKLINE_RECEIVER');
const BIN = process.env.HOOKLINE_BIN || 'target/debug/hookline';
const SCREENSHOT = process.env.PORTAL_SCREENSHOT || 'target/portal-screenshot.png';

let browser;
let page;

before(async () => {
  // 401s of the wrong-token steps and aborted requests of the API-down step are expected; nothing else is.
  browser = await launch('portal', { expected: /status of 401|ERR_FAILED|net::/ });
  page = browser.page;
});

after(async () => {
  await browser?.close();
});

async function switchReceiver(mode) {
  const r = await fetch(`${RECEIVER}/switch/control`, { method: 'POST', body: mode });
  assert.equal(r.status, 204, `the receiver took ${mode}`);
}

/// The scaled-down LuciBook policy: one attempt per delivery, paused after 3 counted failures.
function policyToml() {
  const toml = execFileSync(BIN, ['policy', 'show', 'lucibook'], { encoding: 'utf8' });
  const out = toml
    .replace(/^waits_s = .*$/m, 'waits_s = [1]')
    .replace(/^max_attempts = .*$/m, 'max_attempts = 1')
    .replace(/^after_consecutive_failures = .*$/m, 'after_consecutive_failures = 3');
  assert.notEqual(out, toml);
  assert.match(out, /after_consecutive_failures = 3/);
  return out;
}

/// Waits for the action result to contain `text`; a timeout names what it said instead.
async function result(text) {
  const el = page.locator('#action-result');
  await until(`the result "${text}"`, async () => (await el.textContent()).includes(text)).catch(async (e) => {
    throw new Error(`${e.message}; it says: "${await el.textContent()}"`);
  });
}

const statuses = () => page.locator('#log [data-testid=delivery-status]').allTextContents();

test('the portal, end to end', async (t) => {
  let subId;

  await t.test('the page is public, embedded, and under a strict content security policy', async () => {
    const r = await fetch(`${API}/portal`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/html/);
    assert.match(r.headers.get('content-security-policy'), /^default-src 'self'/);
    assert.match(r.headers.get('cache-control'), /no-cache/);
    const js = await fetch(`${API}/portal/app.js`);
    assert.match(js.headers.get('content-type'), /^text\/javascript/);
    assert.equal((await fetch(`${API}/portal/nope.js`)).status, 404);
    assert.equal((await fetch(`${API}/v1/subscriptions`)).status, 401, 'the data is not');
  });

  await t.test('a wrong token is refused with a clear message', async () => {
    await page.goto(`${API}/portal`);
    const token = page.getByLabel('API token');
    await token.fill('not-the-right-token');
    await token.press('Enter');
    await page.locator('#signin-error', { hasText: 'not a valid token' }).waitFor();
    assert.equal(await page.locator('#session').isVisible(), false, 'no session controls while signed out');
  });

  await t.test('signing in with the keyboard shows the (empty) subscription list', async () => {
    const token = page.getByLabel('API token');
    await token.fill(TOKEN);
    await token.press('Enter');
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    await page.getByText('No subscriptions yet').waitFor();
  });

  await t.test('a subscription is created through the form and its secret shown once', async () => {
    await switchReceiver('fail');
    await page.locator('#btn-create').focus();
    await page.keyboard.press('Enter');
    await page.getByLabel('Endpoint URL').fill(`${RECEIVER}/switch`);
    await page.getByLabel(/^Event types/).fill('portal.*');
    await page.getByLabel('Policy', { exact: true }).selectOption('inline');
    await page.getByLabel(/^Inline policy/).fill(policyToml());
    await page.getByLabel('Description').fill('portal e2e: LuciBook, paused after 3 failures');
    const created = page.waitForRequest((r) => r.method() === 'POST' && new URL(r.url()).pathname === '/v1/subscriptions');
    await page.getByLabel('Description').press('Enter');
    // A create is safe to retry: the form sends an Idempotency-Key.
    assert.match((await created).headers()['idempotency-key'] || '', /^portal-[0-9a-f]{32}$/);
    const secret = page.locator('#secret-value');
    await page.locator('#secret-dialog[open]').waitFor();
    assert.ok((await secret.inputValue()).length >= 16, 'the new secret is shown');
    await page.keyboard.press('Escape');
    await page.locator('#secret-dialog[open]').waitFor({ state: 'detached' });
    await page.waitForURL(/#\/subscriptions\/sub_/);
    subId = decodeURIComponent(new URL(page.url()).hash.split('/')[2]);
    await page.locator('#sub-state', { hasText: 'active' }).waitFor();
  });

  await t.test('three failures pause the subscription; the page shows why and every attempt', async () => {
    for (let i = 0; i < 3; i++) {
      const r = await api('POST', '/v1/events', { id: `evt_portal_${i}`, type: 'portal.ping', data: { n: i } });
      assert.equal(r.status, 202, JSON.stringify(r.body));
    }
    await until('the auto-pause', async () => (await api('GET', `/v1/subscriptions/${subId}`)).body.state === 'paused');
    await page.locator('#sub-state', { hasText: 'paused (consecutive_failures)' }).waitFor();
    await page.locator('[data-fact="Consecutive failures"] dd', { hasText: '3' }).waitFor();
    await until('three failed deliveries in the log', async () => {
      const s = await statuses();
      return s.length === 3 && s.every((x) => x === 'failed');
    });
    // The attempts of one delivery, opened with the keyboard.
    const toggle = page.locator('#log tr[data-delivery] button', { hasText: 'Attempts' }).first();
    await toggle.focus();
    await page.keyboard.press('Enter');
    const attempts = page.locator('#log table.attempts');
    await attempts.waitFor();
    await attempts.locator('td', { hasText: 'HTTP 500' }).first().waitFor();
    await attempts.locator('.excerpt', { hasText: 'switched to fail' }).first().waitFor();
    assert.equal(await page.locator('#log button[aria-expanded=true]').count(), 1);
    await page.screenshot({ path: SCREENSHOT.replace(/\.png$/, '-paused.png'), fullPage: true });
  });

  await t.test('the receiver recovers and the owner resumes with the keyboard', async () => {
    await switchReceiver('ok');
    await page.locator('#btn-resume').focus();
    await page.keyboard.press('Enter');
    await result('Resumed');
    await page.locator('#sub-state', { hasText: 'active' }).waitFor();
  });

  await t.test('replaying since a time asks first, Escape cancels, and the failed deliveries succeed', async () => {
    const button = page.getByRole('button', { name: 'Replay since…' });
    await button.focus();
    await page.keyboard.press('Enter');
    const dialog = page.locator('#confirm-dialog[open]');
    await dialog.waitFor();
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'detached' });
    assert.doesNotMatch(await page.locator('#action-result').textContent(), /Replayed/, 'Escape replayed nothing');
    // Focus went back to the button: Enter opens the dialog again, Enter confirms.
    await page.keyboard.press('Enter');
    await dialog.waitFor();
    await page.keyboard.press('Enter');
    await result('Replayed 3 deliveries');
    await until('three succeeded deliveries in the log', async () => {
      const s = await statuses();
      return s.length === 3 && s.every((x) => x === 'succeeded');
    });
    // The expanded delivery now has two attempts: the 500, then the 204 of the replay.
    await page.locator('#log table.attempts td', { hasText: 'HTTP 204' }).first().waitFor();
  });

  await t.test('the chart shows both outcomes', async () => {
    const chart = page.locator('#chart svg[data-chart=outcomes]');
    await chart.locator('rect[data-outcome=failed]').first().waitFor();
    await chart.locator('rect[data-outcome=succeeded]').first().waitFor();
    await page.locator('#chart svg[data-chart=latency] circle').first().waitFor();
    await page.locator('.chart-summary', { hasText: '3 succeeded' }).waitFor();
    const stats = await api('GET', `/v1/subscriptions/${subId}/stats`);
    assert.equal(stats.status, 200);
    assert.deepEqual([stats.body.totals.counts.succeeded, stats.body.totals.counts.failed], [3, 3]);
    // The chart's classes are the delivery states' words (docs/api.md, "Vocabulary"): dead is not folded into failed.
    assert.deepEqual(stats.body.classes, ['succeeded', 'retried', 'failed', 'dead', 'cancelled', 'other']);
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  });

  await t.test('one delivery is replayed from its row, after a confirmation (any finished one, succeeded too)', async () => {
    const rows = page.locator('#log tr[data-delivery]').filter({ has: page.getByRole('button', { name: 'Replay…' }) });
    await until('a replayable delivery', async () => (await rows.count()) > 0, 20_000);
    // Every finished delivery offers it: the log store keeps every event.
    const log = await api('GET', `/v1/subscriptions/${subId}/deliveries`);
    assert.ok(log.body.items.every((d) => d.replayable === (d.state !== 'pending')), JSON.stringify(log.body.items.map((d) => [d.event_id, d.state, d.replayable])));
    assert.equal(await rows.count(), log.body.items.filter((d) => d.replayable).length, 'a Replay button for every replayable delivery');
    const row = rows.first();
    const event = (await row.locator('code').textContent()).trim();
    const id = await row.getAttribute('data-delivery');
    const before = (await api('GET', `/v1/deliveries/${id}`)).body.attempts.length;
    await row.getByRole('button', { name: 'Replay…' }).focus();
    await page.keyboard.press('Enter');
    await page.locator('#confirm-dialog[open]').waitFor();
    await page.keyboard.press('Enter');
    await result(`Replay of ${event} accepted`);
    await until('the replayed delivery’s new attempt', async () => {
      const d = await api('GET', `/v1/deliveries/${id}`);
      return d.body.attempts.length === before + 1 && d.body.state === 'succeeded';
    });
  });

  await t.test('redriving the dead letters says what it did', async () => {
    await page.getByRole('button', { name: 'Redrive dead letters…' }).click();
    await page.locator('#confirm-dialog[open]').waitFor();
    await page.getByRole('button', { name: 'Redrive', exact: true }).click();
    // Every dead letter of this subscription has succeeded since: nothing is sent again.
    await result('Redrove 0 dead letters, skipped 3');
  });

  await t.test('a down API is said so, and the page recovers', async () => {
    await page.route('**/v1/**', (route) => route.abort('connectionrefused'));
    await page.locator('#refresh').click();
    await page.locator('#banner', { hasText: 'unreachable' }).waitFor();
    await page.unroute('**/v1/**');
    await page.locator('#refresh').click();
    await page.locator('#banner').waitFor({ state: 'hidden' });
  });

  await t.test('an expired token goes back to the sign-in form', async () => {
    await page.evaluate(() => sessionStorage.setItem('hookline.portal.token', 'an-expired-token'));
    await page.reload();
    await page.locator('#signin-error', { hasText: 'the token expired or was revoked' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('hookline.portal.token')), null);
  });

  await t.test('the link hookline dev prints signs in and takes the token out of the address', async () => {
    await page.goto('about:blank');
    await page.goto(`${API}/portal/#token=${encodeURIComponent(TOKEN)}`);
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    assert.equal(new URL(page.url()).hash, '', 'the token is not left in the address bar or history');
  });

  await t.test('no script error and no content-security-policy violation', () => {
    assert.deepEqual(browser.pageErrors, []);
  });
});
