// Pure logic of the SSD token-grid widget: no DOM, no ComfyUI. Tested with `node --test tests/js/`.
// The status codes and the palette are the same as in ssd_core/trace.py (a Python test checks).

export const STATUS_NAMES = ["pending", "ar", "accepted", "corrected", "forced"];

export const PALETTE = {
  pending: "#2b2b2b",
  ar: "#8a8f98",
  accepted: "#3fb950",
  corrected: "#f0883e",
  forced: "#58a6ff",
};

export const BACKGROUND = "#141414";
export const TEXT = "#dddddd";
export const LEGEND_HEIGHT = 76;
export const PAD = 6;

// Status name or code ("2", 2) -> colour.
export function statusColor(status) {
  const name = typeof status === "number" || /^[0-9]$/.test(String(status))
    ? STATUS_NAMES[Number(status)]
    : status;
  return PALETTE[name] ?? BACKGROUND;
}

// A trace in either form (the compact one the node sends, or a full to_dict() trace with
// H lists of W status names) -> the compact form, or null when it is not a trace.
export function normalizeTrace(raw) {
  if (!raw || typeof raw !== "object" || !Array.isArray(raw.grid) || raw.grid.length !== 2) return null;
  const [h, w] = raw.grid.map(Number);
  if (!(h > 0 && w > 0)) return null;
  let status = raw.status;
  if (Array.isArray(status)) {
    status = status.flat().map((s) => String(Math.max(0, STATUS_NAMES.indexOf(s)))).join("");
  }
  if (typeof status !== "string" || status.length !== h * w) return null;
  const flat = (v) => (Array.isArray(v) ? (Array.isArray(v[0]) ? v.flat() : v) : null);
  return {
    v: 1,
    done: raw.done !== false,
    decoder: raw.decoder ?? "",
    grid: [h, w],
    status,
    steps: Number(raw.steps ?? 0),
    wall_s: Number(raw.wall_s ?? 0),
    final: raw.final ?? null,
    counts: raw.counts ?? null,
    step: flat(raw.step),
    round: flat(raw.round),
    tokens_per_step: raw.tokens_per_step ?? null,
    nll: raw.nll ?? null,
    seed: raw.seed ?? null,
    // ssd-exact: the first cell whose decision rounding could flip ([row, col]; null: plain AR's picture)
    first_near_tie: Array.isArray(raw.first_near_tie) && raw.first_near_tie.length === 2
      ? raw.first_near_tie.map(Number)
      : (Array.isArray(raw.exact?.first_near_tie) ? raw.exact.first_near_tie.map(Number) : null),
  };
}

// Counts of every status in a compact status string.
export function countStatuses(status) {
  const counts = Object.fromEntries(STATUS_NAMES.map((n) => [n, 0]));
  for (let i = 0; i < status.length; i++) {
    const name = STATUS_NAMES[status.charCodeAt(i) - 48];
    if (name) counts[name] += 1;
  }
  return counts;
}

// Where the grid goes in a box of width x height, the legend taking LEGEND_HEIGHT below it.
export function layout(grid, width, height, legendHeight = LEGEND_HEIGHT) {
  const [h, w] = grid;
  const availW = Math.max(0, width - 2 * PAD);
  const availH = Math.max(0, height - legendHeight - 2 * PAD);
  const cell = Math.max(0, Math.min(availW / w, availH / h));
  const gw = cell * w;
  const gh = cell * h;
  return {
    rows: h,
    cols: w,
    cell,
    x: PAD + (availW - gw) / 2,
    y: PAD + (availH - gh) / 2,
    width: gw,
    height: gh,
    legendY: height - legendHeight,
  };
}

// The cell under a point (canvas coordinates), or null.
export function cellAt(lay, px, py) {
  if (!lay || lay.cell <= 0) return null;
  const col = Math.floor((px - lay.x) / lay.cell);
  const row = Math.floor((py - lay.y) / lay.cell);
  if (row < 0 || col < 0 || row >= lay.rows || col >= lay.cols) return null;
  return { row, col, index: row * lay.cols + col };
}

// "row 3, col 5: accepted at step 12, round 1"
export function hoverText(trace, cell) {
  if (!trace || !cell) return "";
  const name = STATUS_NAMES[trace.status.charCodeAt(cell.index) - 48] ?? "?";
  let text = `row ${cell.row}, col ${cell.col}: ${name}`;
  if (name === "pending") return text;
  const step = trace.step ? trace.step[cell.index] : undefined;
  const round = trace.round ? trace.round[cell.index] : undefined;
  if (step !== undefined && step !== null) text += ` at step ${step}`;
  if (round !== undefined && round !== null) text += `, round ${round}`;
  return text;
}

function fmtSeconds(s) {
  return s >= 10 ? `${s.toFixed(1)} s` : `${s.toFixed(2)} s`;
}

// What each cell status means, in the words of the node help (web/docs) and the stats output.
export const STATUS_WORDS = {
  accepted: "drafted right",
  corrected: "fixed by the model",
  ar: "one at a time",
  forced: "forced",
  pending: "pending",
};
const LEGEND_ORDER = ["accepted", "corrected", "ar", "forced"];
const EXACT_DECODERS = ["ssd-exact"]; // the same rule as plain AR: the same picture in float32

// The legend's text lines: how each cell was made (with counts), then the headline (the speed-up against one token
// at a time, the time), then the details (steps, tokens per step; for exact decoders: the same image as plain AR).
export function legendLines(trace) {
  if (!trace) return ["SSD: queue the prompt to see the token grid", "", ""];
  const counts = countStatuses(trace.status);
  const cells = trace.grid[0] * trace.grid[1];
  const shown = LEGEND_ORDER.filter((n) => counts[n] > 0);
  let first = shown.map((n) => `${STATUS_WORDS[n]} ${counts[n]}`).join("  ");
  if (counts.pending > 0) first += `${first ? "  " : ""}pending ${counts.pending}`;
  const steps = trace.steps || 0;
  const decoder = `${trace.decoder || "?"}${trace.done ? "" : " (running)"}`;
  // plain AR's steps for the tokens made so far: one a token, less the first (the prompt's forward gives it)
  const arSteps = Math.max(cells - counts.pending - counts.forced - 1, 0);
  const time = fmtSeconds(Number(trace.wall_s || 0));
  let head;
  if (trace.decoder === "ar") head = [decoder, "one token at a time", time];
  else if (steps > 0) head = [decoder, `${(arSteps / steps).toFixed(1)}x fewer steps than one at a time`, time];
  else head = [decoder, time];
  const details = [`${steps} steps`];
  if (steps > 0) details.push(`${((cells - counts.pending) / steps).toFixed(2)} tokens/step`);
  if (EXACT_DECODERS.includes(trace.decoder)) {
    // a near-tie (a decision so close that rounding can flip it) may make the rest differ from plain AR's
    const tie = trace.first_near_tie;
    details.unshift(tie ? `plain AR's image up to row ${tie[0]}, col ${tie[1]} (a near-tie there)`
      : "same image as plain AR (fp32)");
  }
  return [first, head.join(" · "), details.join(" · ")];
}

// The swatches drawn in the legend (every status that occurs, pending last), labelled in plain words.
export function legendSwatches(trace) {
  if (!trace) return [];
  const counts = countStatuses(trace.status);
  return LEGEND_ORDER.filter((n) => counts[n] > 0)
    .concat(counts.pending > 0 ? ["pending"] : [])
    .map((n) => ({ name: n, label: `${STATUS_WORDS[n]} ${counts[n]}`, color: PALETTE[n], count: counts[n] }));
}

// Merge a live event into the state the widget holds: a finished trace is never replaced by a
// late live event of the same run; a new run (step count lower, or grid changed) replaces it.
export function mergeTrace(current, incoming) {
  const next = normalizeTrace(incoming);
  if (!next) return current;
  if (!current) return next;
  if (current.done && !next.done && next.steps >= current.steps &&
      current.grid[0] === next.grid[0] && current.grid[1] === next.grid[1]) {
    return current;
  }
  return next;
}

// Draws the whole widget on a 2D context (anything with the CanvasRenderingContext2D calls used
// here). Runs of equal status in a row are filled as one rectangle.
export function draw(ctx, trace, width, height, hover = null) {
  ctx.fillStyle = BACKGROUND;
  ctx.fillRect(0, 0, width, height);
  const lay = trace ? layout(trace.grid, width, height) : null;
  if (trace && lay.cell > 0) {
    const { rows, cols, cell } = lay;
    for (let r = 0; r < rows; r++) {
      let c = 0;
      while (c < cols) {
        const code = trace.status.charCodeAt(r * cols + c);
        let end = c + 1;
        while (end < cols && trace.status.charCodeAt(r * cols + end) === code) end++;
        ctx.fillStyle = statusColor(code - 48);
        ctx.fillRect(lay.x + c * cell, lay.y + r * cell, (end - c) * cell, cell);
        c = end;
      }
    }
    if (cell >= 6) {
      ctx.strokeStyle = "rgba(0,0,0,0.35)";
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let r = 0; r <= rows; r++) {
        ctx.moveTo(lay.x, lay.y + r * cell);
        ctx.lineTo(lay.x + cols * cell, lay.y + r * cell);
      }
      for (let c = 0; c <= cols; c++) {
        ctx.moveTo(lay.x + c * cell, lay.y);
        ctx.lineTo(lay.x + c * cell, lay.y + rows * cell);
      }
      ctx.stroke();
    }
    if (hover) {
      ctx.strokeStyle = "#ffffff";
      ctx.lineWidth = 2;
      ctx.strokeRect(lay.x + hover.col * cell, lay.y + hover.row * cell, cell, cell);
    }
  }
  // legend
  const ly = height - LEGEND_HEIGHT;
  ctx.font = "12px sans-serif";
  ctx.textBaseline = "middle";
  let x = PAD;
  for (const sw of legendSwatches(trace)) {
    ctx.fillStyle = sw.color;
    ctx.fillRect(x, ly + 6, 12, 12);
    ctx.fillStyle = TEXT;
    const label = sw.label;
    ctx.fillText(label, x + 16, ly + 12);
    x += 16 + (ctx.measureText ? ctx.measureText(label).width : label.length * 7) + 12;
  }
  const [first, headline, details] = legendLines(trace);
  ctx.fillStyle = TEXT;
  if (!trace) ctx.fillText(first, PAD, ly + 12);
  ctx.fillText(headline, PAD, ly + 30);
  const hoverLine = hover ? hoverText(trace, hover) : "hover a cell for its step and round";
  ctx.fillStyle = "#aaaaaa";
  if (trace) {
    ctx.fillText(details, PAD, ly + 48);
    ctx.fillText(hoverLine, PAD, ly + 66);
  }
  return lay;
}

// ---- batches: one trace per image of a run, one of them shown -------------------------------
// A batch is { traces: [trace or null, ...], index }; events and outputs carry `image` (0-based)
// and `images` (the batch size), both absent for a single image.

// Merge a live event or a finished trace of one image into the batch (a new size starts afresh).
export function mergeBatch(batch, incoming) {
  if (!incoming || typeof incoming !== "object") return batch;
  const images = Math.max(1, Math.floor(Number(incoming.images ?? 1)) || 1);
  const image = Math.floor(Number(incoming.image ?? 0));
  if (!(image >= 0 && image < images)) return batch;
  const base = batch && batch.traces.length === images
    ? batch
    : { traces: new Array(images).fill(null), index: Math.min(batch?.index ?? 0, images - 1) };
  const next = mergeTrace(base.traces[image], incoming);
  if (next === base.traces[image]) return base;
  const traces = base.traces.slice();
  traces[image] = next;
  return { traces, index: base.index };
}

// The node's ui output (a list of compact traces, one per image) merged into the batch.
export function batchFromOutput(batch, list) {
  if (!Array.isArray(list) || list.length === 0) return batch;
  return list.reduce((b, t, i) => mergeBatch(b, { ...t, image: t?.image ?? i, images: t?.images ?? list.length }), batch);
}

// The trace shown: the selected image's.
export function selectedTrace(batch) {
  return batch ? batch.traces[batch.index] ?? null : null;
}

// Select the image `delta` away (wrapping), or an index with absolute = true.
export function selectImage(batch, delta, absolute = false) {
  if (!batch || batch.traces.length === 0) return batch;
  const n = batch.traces.length;
  const index = (((absolute ? delta : batch.index + delta) % n) + n) % n;
  return index === batch.index ? batch : { traces: batch.traces, index };
}

// "image 2 of 4 · seed 12" for a batch, "" for a single image.
export function batchLabel(batch) {
  if (!batch || batch.traces.length <= 1) return "";
  const t = selectedTrace(batch);
  const seed = t?.seed !== undefined && t?.seed !== null ? ` · seed ${t.seed}` : "";
  return `image ${batch.index + 1} of ${batch.traces.length}${seed}`;
}

// The sampler's widgets whose value means "decided for you": -1 = the model's default (cfg, temperature, top_k,
// top_p, min_p, verify_rounds), 0 draft rows = picked for the device. The canvas shows these values as "auto"; the
// workflow keeps the number (nodes/sampler.py AUTO and DRAFT_ROWS.default; a test checks the two agree).
export const AUTO_VALUES = Object.freeze({
  cfg: -1, temperature: -1, top_k: -1, top_p: -1, min_p: -1, draft_rows: 0, verify_rounds: -1,
});

// The label suffix of an auto value where the value itself cannot say it (the Vue node renderer's inputs).
export const AUTO_LABEL = " \u00b7 auto";

// "auto" when a widget's value is its auto value, else null (the frontend's own text stays).
export function autoText(name, value) {
  return Object.hasOwn(AUTO_VALUES, name) && Number(value) === AUTO_VALUES[name] ? "auto" : null;
}
