// The widget's pure logic: run with `node --test tests/js/` (Node 18+, no packages needed).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  STATUS_NAMES, PALETTE, BACKGROUND, LEGEND_HEIGHT, statusColor, normalizeTrace, countStatuses, layout,
  cellAt, hoverText, legendLines, legendSwatches, mergeTrace, draw, mergeBatch, batchFromOutput, selectedTrace,
  selectImage, batchLabel, autoText, AUTO_VALUES,
} from "../../web/ssd_grid_core.js";

// 2 x 3 grid: ar accepted corrected / forced accepted pending
const compact = {
  v: 1, done: true, decoder: "ssd", grid: [2, 3], status: "123420", steps: 2, wall_s: 1.234,
  step: [1, 2, 2, 2, 2, -1], round: [0, 0, 1, 0, 0, -1],
};
const full = {
  decoder: "ssd", grid: [2, 3], steps: 2, wall_s: 1.234,
  status: [["ar", "accepted", "corrected"], ["forced", "accepted", "pending"]],
  step: [[1, 2, 2], [2, 2, -1]], round: [[0, 0, 1], [0, 0, -1]],
};

test("status colours: by name and by code, unknown -> background", () => {
  assert.equal(statusColor("accepted"), PALETTE.accepted);
  assert.equal(statusColor(2), PALETTE.accepted);
  assert.equal(statusColor("3"), PALETTE.corrected);
  assert.equal(statusColor("nonsense"), BACKGROUND);
  assert.deepEqual(STATUS_NAMES, ["pending", "ar", "accepted", "corrected", "forced"]);
  assert.notEqual(PALETTE.accepted, PALETTE.corrected);
});

test("normalizeTrace accepts the compact and the full form alike", () => {
  const a = normalizeTrace(compact);
  const b = normalizeTrace(full);
  assert.equal(a.status, "123420");
  assert.equal(b.status, "123420");
  assert.deepEqual(b.step, [1, 2, 2, 2, 2, -1]);
  assert.deepEqual(b.round, a.round);
  assert.equal(b.done, true);
});

test("normalizeTrace refuses what is not a trace", () => {
  assert.equal(normalizeTrace(null), null);
  assert.equal(normalizeTrace({}), null);
  assert.equal(normalizeTrace({ grid: [2, 2], status: "123" }), null);
  assert.equal(normalizeTrace({ grid: [0, 2], status: "" }), null);
  assert.equal(normalizeTrace("x"), null);
});

test("countStatuses", () => {
  assert.deepEqual(countStatuses("123420"), { pending: 1, ar: 1, accepted: 2, corrected: 1, forced: 1 });
  assert.deepEqual(countStatuses(""), { pending: 0, ar: 0, accepted: 0, corrected: 0, forced: 0 });
});

test("layout keeps cells square, centred, above the legend", () => {
  const lay = layout([2, 4], 412, 258 + LEGEND_HEIGHT);
  assert.equal(lay.cell, 100);
  assert.equal(lay.width, 400);
  assert.equal(lay.height, 200);
  assert.equal(lay.x, 6);
  assert.ok(lay.y >= 6 && lay.y + lay.height <= 258 + LEGEND_HEIGHT - LEGEND_HEIGHT);
  const tiny = layout([24, 24], 5, 5);
  assert.equal(tiny.cell, 0);
});

test("cellAt finds the hovered cell and nothing outside the grid", () => {
  const lay = layout([2, 4], 412, 258 + LEGEND_HEIGHT);
  assert.deepEqual(cellAt(lay, lay.x + 1, lay.y + 1), { row: 0, col: 0, index: 0 });
  assert.deepEqual(cellAt(lay, lay.x + 350, lay.y + 150), { row: 1, col: 3, index: 7 });
  assert.equal(cellAt(lay, lay.x - 1, lay.y + 1), null);
  assert.equal(cellAt(lay, lay.x + 1, lay.y + 201), null);
  assert.equal(cellAt(null, 1, 1), null);
});

test("hoverText names status, step and round", () => {
  const t = normalizeTrace(compact);
  assert.equal(hoverText(t, { row: 0, col: 2, index: 2 }), "row 0, col 2: corrected at step 2, round 1");
  assert.equal(hoverText(t, { row: 1, col: 2, index: 5 }), "row 1, col 2: pending");
  const live = normalizeTrace({ grid: [1, 2], status: "22", steps: 1, done: false });
  assert.equal(hoverText(live, { row: 0, col: 1, index: 1 }), "row 0, col 1: accepted");
  assert.equal(hoverText(null, null), "");
});

test("legend: plain words per colour, the speed-up and time, then the details", () => {
  const [counts, run, details] = legendLines(normalizeTrace(compact));
  assert.equal(counts, "drafted right 2  fixed by the model 1  one at a time 1  forced 1  pending 1");
  // 4 tokens made (forced and pending cells are not plain AR's steps; the first comes with the prompt): 3 AR steps
  assert.equal(run, "ssd · 1.5x fewer steps than one at a time · 1.23 s");
  assert.equal(details, "2 steps · 2.50 tokens/step");
  const [, liveRun] = legendLines(normalizeTrace({ ...compact, done: false, wall_s: 12.5 }));
  assert.match(liveRun, /^ssd \(running\) · 1\.5x fewer steps/);
  assert.match(liveRun, /12\.5 s$/);
  const exact = legendLines(normalizeTrace({ ...compact, decoder: "ssd-exact" }));
  assert.match(exact[2], /^same image as plain AR \(fp32\) · 2 steps/);
  const tied = legendLines(normalizeTrace({ ...compact, decoder: "ssd-exact", first_near_tie: [9, 2] }));
  assert.match(tied[2], /^plain AR's image up to row 9, col 2 \(a near-tie there\) · 2 steps/);
  const ar = legendLines(normalizeTrace({ ...compact, decoder: "ar", status: "111111", steps: 6 }));
  assert.equal(ar[1], "ar · one token at a time · 1.23 s");
  assert.match(legendLines(null)[0], /queue/);
  const sw = legendSwatches(normalizeTrace(compact));
  assert.deepEqual(sw.map((s) => s.name), ["accepted", "corrected", "ar", "forced", "pending"]);
  assert.equal(sw[0].count, 2);
  assert.equal(sw[1].label, "fixed by the model 1");
});

test("mergeTrace: live replaces live, a late live event never hides the final trace, a new run does", () => {
  const done = normalizeTrace(compact);
  const late = { grid: [2, 3], status: "123400", steps: 2, done: false };
  assert.equal(mergeTrace(done, late), done);
  const next = mergeTrace(done, { grid: [2, 3], status: "100000", steps: 1, done: false });
  assert.equal(next.steps, 1);
  assert.equal(mergeTrace(next, { bad: true }), next);
  assert.equal(mergeTrace(null, compact).status, "123420");
  const bigger = mergeTrace(done, { grid: [4, 4], status: "1".repeat(16), steps: 5, done: false });
  assert.deepEqual(bigger.grid, [4, 4]);
});

function fakeCtx() {
  const calls = [];
  const ctx = {
    calls,
    fillStyle: "", strokeStyle: "", lineWidth: 1, font: "", textBaseline: "",
    fillRect(x, y, w, h) { calls.push(["fillRect", this.fillStyle, x, y, w, h]); },
    strokeRect(x, y, w, h) { calls.push(["strokeRect", this.strokeStyle, x, y, w, h]); },
    fillText(t, x, y) { calls.push(["fillText", t, x, y]); },
    measureText(t) { return { width: t.length * 6 }; },
    beginPath() {}, moveTo() {}, lineTo() {}, stroke() { calls.push(["stroke"]); },
  };
  return ctx;
}

test("draw paints every status with its colour, merges runs, writes the legend", () => {
  const ctx = fakeCtx();
  const t = normalizeTrace({ ...compact, status: "222320" });
  const lay = draw(ctx, t, 412, 258 + LEGEND_HEIGHT);
  const rects = ctx.calls.filter((c) => c[0] === "fillRect" && c[5] === lay.cell);
  // row 0: "222" -> one run of 3 cells; "3" then "2" then "0" in row 1 -> 3 runs
  const gridRects = rects.filter((c) => c[3] >= lay.y && c[3] < lay.y + lay.height);
  assert.equal(gridRects.length, 4);
  assert.equal(gridRects[0][1], PALETTE.accepted);
  assert.equal(gridRects[0][4], 3 * lay.cell);
  assert.ok(gridRects.some((c) => c[1] === PALETTE.corrected));
  const texts = ctx.calls.filter((c) => c[0] === "fillText").map((c) => c[1]);
  assert.ok(texts.includes("drafted right 4"));
  assert.ok(texts.includes("fixed by the model 1"));
  assert.ok(texts.some((s) => s.includes("fewer steps than one at a time")));
  assert.ok(texts.some((s) => s.includes("tokens/step")));
});

test("draw outlines the hovered cell and copes with no trace", () => {
  const ctx = fakeCtx();
  const t = normalizeTrace(compact);
  draw(ctx, t, 412, 258 + LEGEND_HEIGHT, { row: 1, col: 1, index: 4 });
  assert.equal(ctx.calls.filter((c) => c[0] === "strokeRect").length, 1);
  const empty = fakeCtx();
  assert.equal(draw(empty, null, 300, 300), null);
  assert.ok(empty.calls.some((c) => c[0] === "fillText" && /queue/.test(c[1])));
});

test("a batch keeps one trace per image and shows the selected one", () => {
  let b = mergeBatch(null, { ...compact, done: false, steps: 1, image: 1, images: 3 });
  assert.equal(b.traces.length, 3);
  assert.equal(b.traces[0], null);
  assert.equal(b.traces[1].steps, 1);
  assert.equal(selectedTrace(b), null); // image 1 of 3 selected by default is the first
  b = selectImage(b, 1);
  assert.equal(selectedTrace(b).steps, 1);
  assert.equal(batchLabel(b), "image 2 of 3");
  // the finished output of all three images; the selection stays
  const out = [0, 1, 2].map((i) => ({ ...compact, seed: 10 + i, image: i, images: 3 }));
  b = batchFromOutput(b, out);
  assert.equal(b.index, 1);
  assert.deepEqual(b.traces.map((t) => t.seed), [10, 11, 12]);
  assert.ok(b.traces.every((t) => t.done));
  assert.equal(batchLabel(b), "image 2 of 3 · seed 11");
  // a late live event does not replace a finished image; selection wraps both ways
  assert.equal(mergeBatch(b, { ...compact, done: false, steps: 2, image: 2, images: 3 }), b);
  assert.equal(selectImage(b, 2).index, 0);
  assert.equal(selectImage(b, -2).index, 2);
  assert.equal(selectImage(b, 2, true).index, 2);
  // a single image (no image / images keys): one trace, no label
  const single = batchFromOutput(b, [compact]);
  assert.equal(single.traces.length, 1);
  assert.equal(single.index, 0);
  assert.equal(batchLabel(single), "");
  assert.equal(selectedTrace(single).status, "123420");
  // what is not an image of this batch changes nothing
  assert.equal(mergeBatch(b, { ...compact, image: 5, images: 3 }), b);
  assert.equal(mergeBatch(b, null), b);
});

test("autoText: the sampler's default values read auto, others keep their number", () => {
  assert.equal(autoText("cfg", -1), "auto");
  assert.equal(autoText("top_k", "-1"), "auto");
  assert.equal(autoText("draft_rows", 0), "auto");
  assert.equal(autoText("cfg", 0), null); // cfg 0 is a real value (no guidance)
  assert.equal(autoText("draft_rows", 2), null);
  assert.equal(autoText("verify_rounds", -1), "auto"); // the model's rounds (reference-48: 3)
  assert.equal(autoText("verify_rounds", 0), null); // 0 rounds is a real value (no correction)
  assert.equal(autoText("temperature", 1), null);
  assert.equal(autoText("seed", -1), null); // not an auto widget
  assert.ok(Object.isFrozen(AUTO_VALUES));
});
