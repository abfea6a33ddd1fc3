// The portal's chart: attempts per bucket stacked by outcome, and attempt latency (p50, p95), drawn as inline SVG
// from `GET /v1/subscriptions/{id}/stats`. No library.

const SVG = 'http://www.w3.org/2000/svg';
// The delivery states' words (docs/api.md, "Vocabulary"); `retried` counts attempts another one followed.
const LABELS = { succeeded: 'succeeded', retried: 'retried', failed: 'failed', dead: 'dead', cancelled: 'cancelled', other: 'other' };

function el(name, attrs = {}, ...children) {
  const n = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  for (const c of children) n.append(c);
  return n;
}

function html(name, attrs = {}, ...children) {
  const n = document.createElement(name);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  for (const c of children) n.append(c);
  return n;
}

/// An axis maximum of four equal whole-number steps (1, 2, 5 × 10^k each) at or above v.
function axisMax(v) {
  return 4 * Math.max(1, niceMax(v / 4));
}

/// 1, 2, (2.5,) 5 × 10^k at or above v, a whole number when v > 1.
function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of p >= 10 ? [1, 2, 2.5, 5, 10] : [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const pad2 = (n) => String(n).padStart(2, '0');
const hhmm = (ms) => { const d = new Date(ms); return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`; };
const hhmmss = (ms) => `${hhmm(ms)}:${pad2(new Date(ms).getSeconds())}`;
const fmtMs = (ms) => (ms == null ? '–' : ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${ms} ms`);

function timeAxis(svg, x0, x1, y, start, end, xOf) {
  const span = end - start;
  // Sub-minute steps too: a chart fitted to a few minutes of data still gets a readable axis.
  const steps = [10e3, 15e3, 30e3, 60e3, 2 * 60e3, 5 * 60e3, 10 * 60e3, 15 * 60e3, 30 * 60e3, 3600e3, 2 * 3600e3, 3 * 3600e3, 6 * 3600e3];
  const step = steps.find((s) => span / s <= 8) ?? steps[steps.length - 1];
  const label = step < 60e3 ? hhmmss : hhmm;
  const offset = new Date(start).getTimezoneOffset() * 60e3; // round in local time
  const first = Math.ceil((start - offset) / step) * step + offset;
  svg.append(el('line', { x1: x0, x2: x1, y1: y, y2: y, class: 'axis' }));
  for (let t = first; t <= end; t += step) {
    const x = xOf(t);
    svg.append(el('line', { x1: x, x2: x, y1: y, y2: y + 4, class: 'axis' }));
    svg.append(el('text', { x, y: y + 16, 'text-anchor': 'middle', class: 'tick' }, label(t)));
  }
}

function yAxis(svg, x0, x1, top, bottom, max, fmt) {
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    const y = bottom - ((bottom - top) * i) / 4;
    svg.append(el('line', { x1: x0, x2: x1, y1: y, y2: y, class: i === 0 ? 'axis' : 'grid' }));
    svg.append(el('text', { x: x0 - 6, y: y + 4, 'text-anchor': 'end', class: 'tick' }, fmt(v)));
  }
}

/// Replaces the content of `container` with the chart of `stats`.
export function renderChart(container, stats) {
  const classes = stats.classes;
  const buckets = stats.buckets;
  const totals = stats.totals;
  const W = 760, L = 60, R = 12;
  const start = stats.since_ms, end = stats.since_ms + buckets.length * stats.bucket_ms;
  const xOf = (t) => L + ((t - start) / (end - start)) * (W - L - R);
  const bw = Math.max(1, ((W - L - R) / buckets.length) * 0.8);

  const summaryId = `chart-summary-${Math.random().toString(36).slice(2)}`;
  const parts = classes.filter((c) => totals.counts[c] > 0).map((c) => `${totals.counts[c]} ${LABELS[c] ?? c}`);
  const period = `${hhmm(start)}–${hhmm(Math.min(end, stats.until_ms))}`;
  const summary = totals.attempts === 0
    ? `No attempts between ${period}.`
    : `${totals.attempts} ${totals.attempts === 1 ? 'attempt' : 'attempts'} between ${period}: ${parts.join(', ')}. Latency p50 ${fmtMs(totals.p50_ms)}, p95 ${fmtMs(totals.p95_ms)}.`;

  // Attempts per bucket, stacked by outcome.
  const H = 210, top = 20, bottom = H - 24;
  const maxCount = axisMax(Math.max(0, ...buckets.map((b) => b.attempts)));
  const bars = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart-svg', role: 'img', 'aria-labelledby': summaryId, 'data-chart': 'outcomes' });
  yAxis(bars, L, W - R, top, bottom, maxCount, (v) => String(v));
  for (const b of buckets) {
    if (b.attempts === 0) continue;
    const g = el('g', { class: 'bucket' });
    const words = classes.filter((c) => b.counts[c] > 0).map((c) => `${b.counts[c]} ${LABELS[c] ?? c}`);
    g.append(el('title', {}, `${hhmm(b.start_ms)}: ${words.join(', ')}; p50 ${fmtMs(b.p50_ms)}, p95 ${fmtMs(b.p95_ms)}`));
    let y = bottom;
    for (const c of classes) {
      const n = b.counts[c];
      if (!n) continue;
      const h = ((bottom - top) * n) / maxCount;
      y -= h;
      g.append(el('rect', { x: xOf(b.start_ms) + 0.1 * bw, y, width: bw, height: Math.max(h, 1), class: `bar o-${c}`, 'data-outcome': c, 'data-count': n }));
    }
    bars.append(g);
  }
  timeAxis(bars, L, W - R, bottom, start, end, xOf);
  bars.append(el('text', { x: L, y: 11, class: 'tick unit', 'text-anchor': 'start' }, 'attempts per bucket'));

  // Latency: p50 and p95 per bucket, as lines with a dot on every bucket that has attempts.
  const LH = 150, ltop = 20, lbottom = LH - 24;
  const maxMs = axisMax(Math.max(0, ...buckets.map((b) => b.p95_ms ?? 0)));
  const lat = el('svg', { viewBox: `0 0 ${W} ${LH}`, class: 'chart-svg', role: 'img', 'aria-label': `Attempt latency: p50 ${fmtMs(totals.p50_ms)}, p95 ${fmtMs(totals.p95_ms)}`, 'data-chart': 'latency' });
  yAxis(lat, L, W - R, ltop, lbottom, maxMs, (v) => fmtMs(v));
  for (const [key, cls] of [['p95_ms', 'l-p95'], ['p50_ms', 'l-p50']]) {
    let d = '';
    let prev = false;
    for (const b of buckets) {
      const v = b[key];
      if (v == null) { prev = false; continue; }
      const x = xOf(b.start_ms) + 0.1 * bw + bw / 2;
      const y = lbottom - ((lbottom - ltop) * v) / maxMs;
      d += `${prev ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)} `;
      prev = true;
      const dot = el('circle', { cx: x, cy: y, r: 2.5, class: `dot ${cls}` });
      dot.append(el('title', {}, `${hhmm(b.start_ms)} ${key.replace('_ms', '')}: ${fmtMs(v)}`));
      lat.append(dot);
    }
    if (d) lat.prepend(el('path', { d, class: `line ${cls}` }));
  }
  timeAxis(lat, L, W - R, lbottom, start, end, xOf);
  lat.append(el('text', { x: L, y: 11, class: 'tick unit', 'text-anchor': 'start' }, 'attempt latency'));

  const legend = html('ul', { class: 'legend', 'aria-label': 'Legend' });
  for (const c of classes) {
    legend.append(html('li', {}, html('span', { class: `swatch o-${c}`, 'aria-hidden': 'true' }), LABELS[c] ?? c));
  }
  legend.append(html('li', {}, html('span', { class: 'swatch l-p50', 'aria-hidden': 'true' }), 'latency p50'));
  legend.append(html('li', {}, html('span', { class: 'swatch l-p95', 'aria-hidden': 'true' }), 'latency p95'));

  const p = html('p', { id: summaryId, class: 'chart-summary' }, summary);
  const figure = html('figure', { class: 'chart-figure' }, bars, lat);
  container.replaceChildren(p, legend, figure);
  if (totals.attempts === 0) container.classList.add('empty');
  else container.classList.remove('empty');
}
