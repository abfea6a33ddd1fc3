// The event-type catalogue in the portal (headless Chromium via playwright-core, against `hookline dev`; run by
// scripts/test-portal after portal.spec.mjs). An event type with an example is catalogued through the API and a
// subscription points at the dev receiver; the portal lists the type, and on the subscription's page "Send test
// event" delivers the example and shows the succeeded attempt; the receiver printed that payload (the dev log).
// The type is deleted at the end, so the catalogue is empty again for the specs after this one.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, TOKEN, WAIT, api, launch, required, until } from './harness.mjs';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

const RECEIVER = required('HOOKLINE_RECEIVER');
// scripts/test-portal writes hookline dev's output next to the screenshot.
const SCREENSHOT = process.env.PORTAL_SCREENSHOT || 'target/portal-screenshot.png';
const DEV_LOG = join(dirname(SCREENSHOT), 'portal-dev.log');
const TYPE = 'catalogue.order.created';

let browser;
let page;
const made = { sub: null, other: null, type: false };

before(async () => {
  // The delivery is asked for before the log has indexed it (404), which the page expects.
  browser = await launch('catalogue', { expected: /status of 404|net::/ });
  page = browser.page;
});

after(async () => {
  // Leave hookline dev as it was: an empty catalogue constrains no one's subscriptions.
  for (const id of [made.sub, made.other]) if (id) await api('DELETE', `/v1/subscriptions/${id}`);
  if (made.type) await api('DELETE', `/v1/event-types/${TYPE}`);
  await browser?.close();
});

test('the catalogue and the test-event button', async (t) => {
  const example = { order_id: `ord_${Date.now()}`, total_cents: 4200, currency: 'EUR' };

  await t.test('an event type with an example and a subscription to the receiver, through the API', async () => {
    const r = await api('POST', '/v1/event-types', {
      name: TYPE,
      description: 'An order was placed',
      schema: { type: 'object', required: ['order_id'], properties: { order_id: { type: 'string' }, total_cents: { type: 'integer' } } },
      examples: [example],
    });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    made.type = true;
    const s = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/ok`, event_types: ['catalogue.order.*'], description: 'catalogue e2e' });
    assert.equal(s.status, 201, JSON.stringify(s.body));
    made.sub = s.body.id;
    // A second one for the same type: the test event must not reach it.
    const other = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/ok`, event_types: [TYPE], description: 'catalogue e2e bystander' });
    assert.equal(other.status, 201, JSON.stringify(other.body));
    made.other = other.body.id;
  });

  await t.test('the portal lists the catalogue with its schema and first example', async () => {
    await page.goto(`${API}/portal/#token=${encodeURIComponent(TOKEN)}`);
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    await page.getByRole('link', { name: 'Event types' }).click();
    await page.getByRole('heading', { name: 'Event types' }).waitFor();
    const row = page.locator(`#event-types tr[data-event-type="${TYPE}"]`);
    await row.waitFor();
    const cells = await row.locator('td').allTextContents();
    assert.equal(cells[0], TYPE);
    assert.equal(cells[1], 'An order was placed');
    assert.match(cells[2], /^yes/);
    assert.deepEqual(JSON.parse(cells[3]), example);
  });

  await t.test('Send test event delivers the example to this subscription and shows the succeeded attempt', async () => {
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(made.sub)}`);
    await page.locator('#sub-title', { hasText: `${RECEIVER}/ok` }).waitFor();
    const select = page.getByLabel(/^Event type \(catalogued/);
    await until('the type among the choices', async () => (await select.locator('option').allTextContents()).includes(TYPE));
    await select.selectOption(TYPE);
    assert.deepEqual(JSON.parse(await page.locator('#te-example').textContent()), example, 'the example is shown before it is sent');
    const sent = page.waitForResponse((r) => r.request().method() === 'POST' && r.url().endsWith('/test-event'));
    await page.getByRole('button', { name: 'Send test event' }).click();
    const answer = await (await sent).json();
    assert.match(answer.event_id, /^evt_test_/);
    const out = page.locator('[data-testid=test-event-result]');
    await until('the attempt in the page', async () => /succeeded · HTTP 204 · \d+(\.\d)? m?s/.test(await out.textContent())).catch(async (e) => {
      throw new Error(`${e.message}; it says: "${await out.textContent()}"`);
    });
    assert.match(await out.textContent(), new RegExp(answer.event_id));
    await page.screenshot({ path: SCREENSHOT.replace(/\.png$/, '-test-event.png'), fullPage: true });

    // The receiver got the example as the event's data (hookline dev prints each webhook it receives).
    const line = await until('the receiver to print the test event', async () =>
      readFileSync(DEV_LOG, 'utf8').split('\n').find((l) => l.includes('webhook on /ok') && l.includes(answer.event_id)));
    const body = JSON.parse(line.slice(line.indexOf('{')));
    assert.equal(body.type, TYPE);
    assert.deepEqual(body.data, example);

    // Only the chosen subscription: the bystander's delivery log stays empty.
    const d = await api('GET', `/v1/deliveries?event_id=${answer.event_id}`);
    assert.equal(d.status, 200);
    assert.deepEqual(d.body.items.map((x) => x.subscription_id), [made.sub]);
    const bystander = await api('GET', `/v1/subscriptions/${made.other}/deliveries`);
    assert.deepEqual(bystander.body.items, []);
    await api('DELETE', `/v1/subscriptions/${made.other}`);
  });

  assert.deepEqual(browser.pageErrors, []);
});
