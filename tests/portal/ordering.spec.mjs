// Ordered delivery on the subscription's page (headless Chromium via playwright-core, against `hookline dev`; run by
// scripts/test-portal after portal.spec.mjs): a subscription ordered by `entity_id` says so in its facts, a strict one
// says "one at a time", an unordered one "none". All are deleted at the end.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { API, TOKEN, api, launch, required } from './harness.mjs';

const RECEIVER = required('HOOKLINE_RECEIVER');
const TYPE = 'portalordering.ping';

let browser;
let page;
const made = [];

before(async () => {
  browser = await launch('ordering');
  page = browser.page;
});

after(async () => {
  for (const id of made) await api('DELETE', `/v1/subscriptions/${id}`);
  await browser?.close();
});

async function create(body) {
  const r = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/ok`, event_types: [TYPE], ...body });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  made.push(r.body.id);
  return r.body.id;
}

async function orderingFact(id) {
  await page.goto(`${API}/portal/#/subscriptions/${encodeURIComponent(id)}`);
  await page.locator('#sub-title', { hasText: '/ok' }).waitFor();
  const fact = page.locator(`[data-fact="Ordering"] dd`);
  await fact.waitFor();
  // The page has drawn this subscription: its id fact matches.
  await page.locator('[data-fact="ID"] dd', { hasText: id }).waitFor();
  return fact.textContent();
}

test('the ordering fact', async (t) => {
  await page.goto(`${API}/portal/#token=${encodeURIComponent(TOKEN)}`);
  await page.getByRole('heading', { name: 'Subscriptions' }).waitFor();

  await t.test('refused without its key, naming the field', async () => {
    const r = await api('POST', '/v1/subscriptions', { url: `${RECEIVER}/ok`, event_types: [TYPE], ordering: 'key' });
    assert.equal(r.status, 422, JSON.stringify(r.body));
    assert.equal(r.body.error.field, 'ordering_key');
  });

  await t.test('by key, strict and none', async () => {
    const byEntity = await create({ ordering: 'key', ordering_key: 'entity_id', description: 'ordering e2e key' });
    const strict = await create({ ordering: 'strict', description: 'ordering e2e strict' });
    const plain = await create({ description: 'ordering e2e none' });
    assert.equal(await orderingFact(byEntity), 'by entity_id');
    assert.equal(await orderingFact(strict), 'strict (one at a time)');
    assert.equal(await orderingFact(plain), 'none (concurrent)');
    assert.deepEqual(browser.pageErrors, []);
  });
});
