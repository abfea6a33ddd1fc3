// The delivery log in the portal, in headless Chromium against `hookline dev` (run by scripts/test-portal, after
// portal.spec.mjs). The story: a subscription of its own (a unique description) points at a receiver this test
// runs, which answers 200 with a header of its own; an event is delivered; the event is found in the portal by its
// id, its delivery opened: the request headers as sent (the event id and timestamp; the signature redacted, never
// shown) and the response's status and headers; it is resent from the portal and the receiver gets it again with
// the same event id.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, TOKEN, WAIT, api, launch, until } from './harness.mjs';
import { createServer } from 'node:http';

const SCREENSHOT = (process.env.PORTAL_SCREENSHOT || 'target/portal-screenshot.png').replace(/\.png$/, '-log.png');

let browser;
let page;
let receiver;
let receiverUrl;
const received = [];

before(async () => {
  // The receiver: records every request, answers 200 with a header the portal must show.
  receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      received.push({ path: req.url, headers: req.headers, body });
      res.writeHead(200, { 'content-type': 'text/plain', 'x-receiver': 'portal-log-spec' });
      res.end('thanks');
    });
  });
  await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  receiverUrl = `http://127.0.0.1:${receiver.address().port}`;

  browser = await launch('portal-log', { expected: /net::/ });
  page = browser.page;
});

after(async () => {
  await browser?.close();
  await new Promise((resolve) => (receiver ? receiver.close(resolve) : resolve()));
});

/// The value shown for `name` in one of the attempt's header tables.
async function shownHeader(table, name) {
  const row = table.locator('tr', { has: page.locator('th', { hasText: new RegExp(`^${name}$`, 'i') }) });
  if ((await row.count()) === 0) return null;
  return (await row.first().locator('td').textContent()).trim();
}

test('the delivery log in the portal: search, attempt detail, resend', async (t) => {
  const stamp = Date.now();
  const eventId = `evt_portal_log_${stamp}`;
  let deliveryId;
  let subId;

  await t.test('an event is delivered to a subscription of this test', async () => {
    const sub = await api('POST', '/v1/subscriptions', {
      url: `${receiverUrl}/hooks`,
      event_types: ['portallog.*'],
      policy: 'standard',
      description: `portal log spec ${stamp}`,
    });
    assert.equal(sub.status, 201, JSON.stringify(sub.body));
    subId = sub.body.id;
    const ev = await api('POST', '/v1/events', { id: eventId, type: 'portallog.ping', data: { n: 1 } });
    assert.equal(ev.status, 202, JSON.stringify(ev.body));
    await until('the receiver got the event', async () => received.length === 1);
    assert.equal(received[0].headers['webhook-id'], eventId);
    await until('the delivery is succeeded in the log', async () => {
      const r = await api('GET', `/v1/deliveries?event_id=${eventId}`);
      const d = r.body && r.body.items && r.body.items[0];
      if (d && d.state === 'succeeded') deliveryId = d.delivery_id;
      return Boolean(deliveryId);
    });
  });

  await t.test('the portal finds the event by its id and opens its delivery', async () => {
    await page.goto(`${API}/portal`);
    const token = page.getByLabel('API token');
    await token.fill(TOKEN);
    await token.press('Enter');
    await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();
    const search = page.getByRole('searchbox', { name: 'Event id' });
    await search.fill(eventId);
    await search.press('Enter');
    const row = page.locator(`#found tr[data-found="${deliveryId}"]`);
    await row.locator('[data-testid=found-status]', { hasText: 'succeeded' }).waitFor();
    assert.equal(await page.locator('#found tr[data-found]').count(), 1, 'one subscription got the event');
    await row.getByRole('button', { name: 'Open' }).click();
    await page.locator('#found-h', { hasText: deliveryId }).waitFor();
    await page.locator('#found-delivery table.attempts td', { hasText: 'HTTP 200' }).first().waitFor();
  });

  await t.test('the attempt shows the request headers as sent, the signature redacted, and the response', async () => {
    const attempt = page.locator('#found-delivery table.attempts > tbody > tr').first();
    await attempt.locator('details.attempt-headers summary').click();
    const req = attempt.locator('[data-testid=request-headers]');
    await req.waitFor();
    assert.equal(await shownHeader(req, 'webhook-id'), eventId);
    assert.equal(await shownHeader(req, 'webhook-timestamp'), received[0].headers['webhook-timestamp']);
    assert.equal(await shownHeader(req, 'content-type'), 'application/json');
    assert.equal(await shownHeader(req, 'webhook-signature'), '<redacted>');
    const signature = received[0].headers['webhook-signature'];
    assert.match(signature, /^v1,/, 'the receiver got a real signature');
    const text = await page.locator('#found-delivery').textContent();
    assert.ok(!text.includes(signature.slice(3)), 'the signature is nowhere on the page');
    const resp = attempt.locator('[data-testid=response-headers]');
    assert.equal(await shownHeader(resp, 'x-receiver'), 'portal-log-spec');
    assert.match(await shownHeader(resp, 'content-type'), /^text\/plain/);
    await attempt.locator('.excerpt', { hasText: 'thanks' }).waitFor();
    await attempt.locator('[data-testid=reasoning]', { hasText: 'rule 1 (2xx)' }).waitFor();
    // The body's payload: the event's data, as the receiver got it.
    await page.locator('#found-delivery details.event-body summary').click();
    const shown = JSON.parse(await page.locator('#found-delivery [data-testid=event-data]').textContent());
    assert.deepEqual(shown, JSON.parse(received[0].body).data, 'the event data the receiver got');
    // Labelled as what it is (the body's `data`, not the body), and every time says its zone.
    assert.match(await page.locator('#found-delivery details.event-body summary').textContent(), /^Event data: .*"data"$/);
    assert.match(await page.locator('#found-delivery').textContent(), /\d\d:\d\d:\d\d UTC([+−]\d\d:\d\d)?/);
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  });

  await t.test('it is resent from the portal and arrives again with the same event id', async () => {
    await page.locator('#found-resend').click();
    const dialog = page.locator('#confirm-dialog[open]');
    await dialog.waitFor();
    await dialog.getByRole('button', { name: 'Resend' }).click();
    await page.locator('#find-result', { hasText: 'accepted' }).waitFor();
    await until('the receiver got it again', async () => received.length === 2);
    assert.deepEqual(received.map((r) => r.headers['webhook-id']), [eventId, eventId], 'the same event id both times');
    assert.equal(received[1].body, received[0].body, 'the same event');
    // The portal's delivery view refreshes to the resend's attempt.
    await until('two attempts in the portal', async () => (await page.locator('#found-delivery table.attempts > tbody > tr').count()) === 2);
    assert.deepEqual(browser.pageErrors, []);
  });

  await t.test('the log says when its history trails Kafka, and nothing while it keeps up', async () => {
    // hookline dev's indexer keeps up: the page's `history` is a fraction of a second behind, and no notice shows.
    const r = await api('GET', `/v1/subscriptions/${encodeURIComponent(subId)}/deliveries`);
    assert.ok(r.body.history && r.body.history.behind_ms < 5000, JSON.stringify(r.body.history));
    await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(subId)}`);
    await page.locator('#log tr[data-delivery]').first().waitFor();
    assert.equal(await page.locator('[data-testid=log-lag]').isHidden(), true);
    // The API's own page, with the `history` an indexer 42 s behind writes (a flood on a slow store).
    const lists = '**/v1/subscriptions/*/deliveries*';
    await page.route(lists, async (route) => {
      const response = await route.fetch();
      const body = await response.json();
      body.history = { behind_ms: 42_000, as_of_ms: Date.now() };
      await route.fulfill({ response, json: body });
    });
    await page.reload();
    await page.locator('[data-testid=log-lag]', { hasText: 'History is 42 s behind' }).waitFor();
    await page.unroute(lists);
    assert.deepEqual(browser.pageErrors, []);
  });
});
