// What every portal spec shares: the environment scripts/test-portal passes, calls to the API (as the admin or
// another credential), a bounded poll, and a headless Debian Chromium whose page errors are collected.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

export const WAIT = 60_000;

export function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this through scripts/test-portal`);
  return v;
}

export const API = required('HOOKLINE_API');
export const TOKEN = process.env.HOOKLINE_TOKEN || 'dev-token-not-for-production';

/// One API call; `{ status, body }` with the body parsed (null when empty).
export async function api(method, path, body, token = TOKEN) {
  const r = await fetch(API + path, {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

/// Polls `fn` every 250 ms until it returns something truthy (returned), or fails naming `what` after `ms`.
export async function until(what, fn, ms = WAIT) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const v = await fn();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/// Starts Chromium in a fresh profile. Page errors, and console errors other than `expected` (the failed requests
/// a story makes on purpose), are collected in `pageErrors`; `watch` does the same for another page.
export async function launch(name, { viewport = { width: 1366, height: 900 }, expected = /net::/ } = {}) {
  const userDataDir = mkdtempSync(join(tmpdir(), `hookline-${name}-chromium-`));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    viewport,
    timeout: WAIT,
  });
  context.setDefaultTimeout(WAIT);
  const pageErrors = [];
  const watch = (p) => {
    p.on('pageerror', (e) => pageErrors.push(`page error: ${e.message}`));
    p.on('console', (m) => {
      if (m.type() === 'error' && !expected.test(m.text())) pageErrors.push(`console: ${m.text()}`);
    });
  };
  const page = context.pages()[0] ?? (await context.newPage());
  watch(page);
  const close = async () => {
    await context.close();
    rmSync(userDataDir, { recursive: true, force: true });
  };
  return { context, page, pageErrors, watch, close };
}
