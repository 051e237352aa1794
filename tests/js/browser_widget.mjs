// Drives a real ComfyUI page in Chromium (playwright-core, no bundled browser): loads the bundled
// example workflow, queues it, waits for both samplers, checks the widget, takes screenshots, reloads.
// Run by tests/test_browser.py; by hand:
//   SSD_URL=http://127.0.0.1:8188 SSD_OUT=/tmp/out node tests/js/browser_widget.mjs
// Not a *.test.mjs file: `node --test tests/js/` leaves it alone.
import { chromium } from "playwright-core";
import { mkdtempSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const URL = process.env.SSD_URL ?? "http://127.0.0.1:8188";
const PACK = process.env.SSD_PACK_NAME ?? "ComfyUI-SSD";
const WORKFLOW = process.env.SSD_WORKFLOW ?? "SSD Bundled 24x24 model - ar vs ssd-exact vs ssd";
const OUT = process.env.SSD_OUT ?? "out";
const TIMEOUT = Number(process.env.SSD_RUN_TIMEOUT_S ?? 600) * 1000;
const CHROMIUM = process.env.SSD_CHROMIUM ?? "/usr/bin/chromium";
const SAMPLERS = ["3", "4", "5"]; // ar, ssd-exact, ssd in the example workflow

mkdirSync(OUT, { recursive: true });
const result = { consoleErrors: [], consoleWarnings: [], pageErrors: [], failedRequests: [], steps: [] };
const step = (s) => { result.steps.push(s); console.log("step:", s); };

// window.__ssdLive counts the pack's live "ssd.grid" events: how many, how many while running, from which nodes
const countLiveEvents = () => page.evaluate(async () => {
  const { api } = await import("/scripts/api.js");
  window.__ssdLive = { events: 0, running: 0, nodes: [] };
  api.addEventListener("ssd.grid", (e) => {
    window.__ssdLive.events++;
    const id = String(e.detail?.node);
    if (!window.__ssdLive.nodes.includes(id)) window.__ssdLive.nodes.push(id);
    if (e.detail?.done === false) window.__ssdLive.running++;
  });
});

const context = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "ssd-chromium-")), {
  executablePath: CHROMIUM,
  headless: true,
  viewport: { width: 1500, height: 950 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const page = context.pages()[0] ?? (await context.newPage());
// every console.warn / console.error with the stack that logged it: a message whose stack passes through the
// pack's files came from the pack (or from a frontend API that the pack called, e.g. a deprecated one)
await page.addInitScript((pack) => {
  window.__ssdLogged = [];
  for (const level of ["warn", "error"]) {
    const orig = console[level].bind(console);
    console[level] = (...args) => {
      const stack = new Error().stack ?? "";
      if (stack.includes(`/extensions/${pack}/`)) {
        window.__ssdLogged.push({ level, text: args.map((a) => String(a)).join(" ").slice(0, 500), stack });
      }
      return orig(...args);
    };
  }
}, PACK);
const packLogged = async () => page.evaluate(() => window.__ssdLogged ?? []).catch(() => []);
result.packLogged = [];
page.on("console", (m) => {
  if (m.type() === "error") result.consoleErrors.push({ text: m.text(), url: m.location()?.url ?? "" });
  if (m.type() === "warning") result.consoleWarnings.push({ text: m.text(), url: m.location()?.url ?? "" });
});
page.on("pageerror", (e) => result.pageErrors.push(String(e?.stack ?? e)));
page.on("requestfailed", (r) => result.failedRequests.push(`${r.url()} ${r.failure()?.errorText}`));

// A returning user's settings: no first-run dialog; navigation mode "custom" because the frontend
// 1.27 default ("legacy") throws a TypeError from its own settings store on every load (core bug).
async function seedSettings() {
  const r = await fetch(`${URL}/api/settings`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ "Comfy.TutorialCompleted": true, "Comfy.Canvas.NavigationMode": "custom",
    "Comfy.Minimap.Visible": false }),
  });
  result.seededSettings = r.status;
}

async function openApp() {
  await page.goto(URL, { waitUntil: "load" });
  await page.waitForFunction(() => window.app?.graph && window.LiteGraph?.registered_node_types?.SSDSampler,
    null, { timeout: 120000 });
  result.frontendVersion = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ ?? null);
}

// the grid widget's state of a node (found by a path of ids through subgraphs: [12, 4] = node 4 inside node 12)
async function nodeWidget(path) {
  return page.evaluate((path) => {
    let graph = window.app.graph;
    let node = null;
    for (const id of path) {
      node = graph?.getNodeById(Number(id));
      graph = node?.subgraph;
    }
    const ws = (node?.widgets ?? []).filter((x) => x.name === "ssd_grid");
    const t = ws[0]?.ssd?.state?.trace;
    return { type: node?.type ?? null, widgets: ws.length, done: t?.done ?? false, grid: t?.grid ?? null,
      decoder: t?.decoder ?? null, seed: t?.seed ?? null, saved: Boolean(node?.properties?.ssd_trace?.done),
      element: ws[0]?.element ? ws[0].element.isConnected : null };
  }, path);
}

// state of the grid widget of every sampler node, in the page
async function widgetStates() {
  return page.evaluate(async ({ ids, pack }) => {
    const core = await import(`/extensions/${pack}/ssd_grid_core.js`);
    const hex = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
    const out = {};
    for (const id of ids) {
      const node = window.app.graph.getNodeById(Number(id));
      const w = node?.widgets?.find((x) => x.name === "ssd_grid");
      if (!w) { out[id] = { widget: false }; continue; }
      const t = w.ssd.state.trace;
      const canvas = w.element.querySelector("canvas");
      const counts = {};
      if (canvas.width > 0 && canvas.height > 0) {
        const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        for (const [name, color] of Object.entries(core.PALETTE)) {
          const [r, g, b] = hex(color);
          let n = 0;
          for (let i = 0; i < data.length; i += 4) {
            if (Math.abs(data[i] - r) < 3 && Math.abs(data[i + 1] - g) < 3 && Math.abs(data[i + 2] - b) < 3) n++;
          }
          counts[name] = n;
        }
      }
      const rect = canvas.getBoundingClientRect();
      out[id] = {
        widget: true,
        done: t?.done ?? false,
        decoder: t?.decoder ?? null,
        grid: t?.grid ?? null,
        steps: t?.steps ?? null,
        legend: t ? core.legendLines(t) : null,
        pixels: counts,
        rect: { x: rect.x, y: rect.y, width: rect.width, height: rect.height },
        scale: canvas.clientWidth > 0 ? rect.width / canvas.clientWidth : 1,
        layout: w.ssd.state.layout ?? null,
        saved: Boolean(node.properties?.ssd_trace?.done),
        serialized: JSON.stringify(node.serialize().widgets_values),
      };
    }
    return out;
  }, { ids: SAMPLERS, pack: PACK });
}

try {
  step("open");
  await seedSettings();
  await openApp();

  step("load workflow");
  // as an artist does: Workflow > Browse Templates > ComfyUI-SSD > the bundled example
  try {
    await page.evaluate(() => window.app.extensionManager.command.execute("Comfy.BrowseTemplates"));
    // PrimeVue's .p-dialog up to frontend 1.2x, a role="dialog" element in newer ones
    const dialog = page.locator('.p-dialog, [role="dialog"]').filter({ hasText: PACK }).first();
    await dialog.waitFor({ timeout: 30000 });
    await dialog.getByText(PACK, { exact: true }).first().click();
    const card = dialog.getByText(WORKFLOW, { exact: true }).first();
    await card.waitFor({ timeout: 30000 });
    await page.waitForTimeout(1500); // thumbnails
    await page.screenshot({ path: join(OUT, "template_browser.png") });
    // the pack's cards in the order the dialog shows them (top to bottom, left to right): the first is what a new
    // user sees first
    result.templateOrder = await dialog.evaluate((root) => {
      const cards = [...root.querySelectorAll("*")].filter(
        (e) => e.children.length === 0 && /^SSD .+ - .+ vs .+$/.test(e.textContent.trim()));
      const at = (e) => e.getBoundingClientRect();
      return cards.sort((a, b) => at(a).y - at(b).y || at(a).x - at(b).x).map((e) => e.textContent.trim())
        .filter((name, i, all) => all.indexOf(name) === i);
    });
    await card.click();
    await page.waitForFunction(() => window.app.graph.getNodeById(4)?.type === "SSDSampler", null, { timeout: 30000 });
    result.loadedBy = "template browser";
  } catch (e) {
    result.templateBrowserError = String(e).slice(0, 500);
    await page.keyboard.press("Escape").catch(() => {});
    await page.evaluate(async ({ pack, name }) => {
      const r = await fetch(`/api/workflow_templates/${pack}/${name}.json`);
      await window.app.loadGraphData(await r.json());
    }, { pack: PACK, name: WORKFLOW });
    result.loadedBy = "app.loadGraphData";
  }
  await page.waitForTimeout(500);
  result.nodesLoaded = await page.evaluate(() => window.app.graph._nodes.length);

  await countLiveEvents(); // as the page sees them
  result.before = await widgetStates();

  step("queue");
  const runButton = page.locator('button:has-text("Run")').first();
  if (await runButton.isVisible().catch(() => false)) {
    await runButton.click();
    result.queuedBy = "Run button";
  } else {
    await page.evaluate(() => window.app.queuePrompt(0, 1));
    result.queuedBy = "app.queuePrompt";
  }

  step("wait");
  await page.waitForFunction((ids) => ids.every((id) => {
    const n = window.app.graph.getNodeById(Number(id));
    return n?.widgets?.find((x) => x.name === "ssd_grid")?.ssd?.state?.trace?.done;
  }), SAMPLERS, { timeout: TIMEOUT, polling: 250 });
  await page.waitForTimeout(600); // let requestAnimationFrame draw
  result.live = await page.evaluate(() => window.__ssdLive);
  result.after = await widgetStates();
  // every node's box after the run (title bar included), in graph units, and where the view puts it on screen
  result.layout = await page.evaluate(() => {
    const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
    const ds = window.app.canvas.ds;
    return {
      scale: ds.scale, offset: [ds.offset[0], ds.offset[1]],
      nodes: window.app.graph._nodes.map((n) => ({
        id: n.id, type: n.type, x: n.pos[0], y: n.pos[1] - title, w: n.size[0], h: n.size[1] + title,
      })),
    };
  });

  // the stats boxes (PreviewAny 9-11 under the samplers): their text and whether it fits without a scrollbar
  await page.waitForTimeout(400);
  result.statsBoxes = await page.evaluate(() => [9, 10, 11].map((id) => {
    const node = window.app.graph.getNodeById(id);
    const boxes = [...document.querySelectorAll("textarea")].filter((t) => t.value.includes("model steps"));
    const own = (node?.widgets ?? []).map((w) => w.inputEl ?? w.element).find((e) => e?.tagName === "TEXTAREA");
    const box = own ?? boxes[[9, 10, 11].indexOf(id)];
    if (!box) return { id, missing: true, textareas: boxes.length };
    return { id, text: box.value, scrollHeight: box.scrollHeight, clientHeight: box.clientHeight,
      scrollWidth: box.scrollWidth, clientWidth: box.clientWidth, overflowY: getComputedStyle(box).overflowY };
  }));

  step("hover");
  const ssd = result.after["4"];
  if (ssd.layout && ssd.layout.cell > 0) {
    const k = ssd.scale || 1; // the frontend scales DOM widgets with the canvas zoom
    const x = ssd.rect.x + (ssd.layout.x + ssd.layout.cell * 1.5) * k;
    const y = ssd.rect.y + (ssd.layout.y + ssd.layout.cell * 1.5) * k;
    await page.mouse.move(x, y);
    await page.waitForTimeout(300);
    result.hoverTitle = await page.evaluate(() => {
      const n = window.app.graph.getNodeById(4);
      return n.widgets.find((x) => x.name === "ssd_grid").element.querySelector("canvas").title;
    });
  }

  step("screenshot");
  await page.screenshot({ path: join(OUT, "widget.png") });
  const r = result.after["4"].rect;
  const pad = 12;
  await page.screenshot({
    path: join(OUT, "widget_grid.png"),
    clip: { x: Math.max(0, r.x - pad), y: Math.max(0, r.y - pad), width: r.width + 2 * pad, height: r.height + 2 * pad },
  });

  step("reload");
  result.packLogged.push(...(await packLogged()));
  await page.reload({ waitUntil: "load" });
  await page.waitForFunction(() => window.app?.graph && window.app.graph.getNodeById(4)?.widgets?.find((x) => x.name === "ssd_grid"),
    null, { timeout: 120000 });
  await page.waitForTimeout(1000);
  result.reloaded = await widgetStates();
  await page.screenshot({ path: join(OUT, "widget_reloaded.png") });

  step("batch selector");
  // a batch output of 3 images on the ar sampler's widget (image 1 all accepted), then a real click on "next"
  await page.evaluate(() => {
    const w = window.app.graph.getNodeById(3).widgets.find((x) => x.name === "ssd_grid");
    const base = w.ssd.state.trace;
    const accepted = "2".repeat(base.status.length);
    w.ssd.set([0, 1, 2].map((i) => ({ ...base, seed: 100 + i, image: i, images: 3,
      status: i === 1 ? accepted : base.status })), false);
  });
  await page.waitForTimeout(300);
  const readBatch = () => page.evaluate(() => {
    const w = window.app.graph.getNodeById(3).widgets.find((x) => x.name === "ssd_grid");
    const bar = w.element.querySelector(".ssd-grid-batch");
    return { index: w.ssd.state.batch?.index ?? null, images: w.ssd.state.batch?.traces.length ?? 0,
      seed: w.ssd.state.trace?.seed ?? null, label: bar?.querySelector("span")?.textContent ?? "",
      shown: bar ? getComputedStyle(bar).display !== "none" : false };
  });
  result.batchBefore = await readBatch();
  const nextButton = await page.evaluateHandle(() => window.app.graph.getNodeById(3).widgets
    .find((x) => x.name === "ssd_grid").element.querySelectorAll(".ssd-grid-batch button")[1]);
  await nextButton.click();
  await page.waitForTimeout(400);
  result.batchAfter = await readBatch();
  result.batchPixels = (await widgetStates())["3"]?.pixels ?? null;

  step("no widgets at creation");
  // a frontend that runs onNodeCreated before the node has a widgets array (or after removing it)
  result.noWidgets = await page.evaluate(() => {
    const node = window.LiteGraph.createNode("SSDSampler");
    node.widgets = undefined;
    let error = null;
    try {
      node.onNodeCreated();
    } catch (e) {
      error = String(e);
    }
    const ws = (node.widgets ?? []).filter((x) => x.name === "ssd_grid");
    return { error, widgets: ws.length, api: Boolean(ws[0]?.ssd) };
  });

  step("auto widgets");
  // the sampler's "model default" values read auto on the canvas; the workflow keeps the numbers
  result.autoWidgets = await page.evaluate(() => {
    const node = window.app.graph.getNodeById(3);
    const read = (name) => {
      const w = node.widgets.find((x) => x.name === name);
      return { value: w?.value ?? null, shown: w?._displayValue ?? null };
    };
    const out = { cfg: read("cfg"), draft_rows: read("draft_rows"), verify_rounds: read("verify_rounds"), seed: read("seed") };
    const cfg = node.widgets.find((x) => x.name === "cfg");
    const old = cfg.value;
    cfg.value = 2.5;
    out.cfgSet = read("cfg");
    cfg.value = old;
    out.saved = node.serialize().widgets_values.slice(0, 8);
    return out;
  });

  step("copy and paste");
  result.paste = await page.evaluate(() => {
    const { app } = window;
    const before = new Set(app.graph._nodes.map((n) => n.id));
    const original = app.graph.getNodeById(4);
    app.canvas.selectItems?.([original]) ?? app.canvas.selectNode(original);
    app.canvas.copyToClipboard();
    app.canvas.pasteFromClipboard({});
    const added = app.graph._nodes.filter((n) => !before.has(n.id));
    return { added: added.map((n) => n.type), id: added[0]?.id ?? null };
  });
  await page.waitForTimeout(500);
  if (result.paste.id !== null) {
    result.pasted = await nodeWidget([result.paste.id]);
    result.pastedOriginal = await nodeWidget([4]);
    await page.evaluate((id) => window.app.graph.remove(window.app.graph.getNodeById(id)), result.paste.id);
  }

  step("subgraph");
  const [major, minor] = String(result.frontendVersion ?? "0.0").split(".").map(Number);
  if (major === 1 && minor < 24) result.subgraph = { skipped: `frontend ${result.frontendVersion} has no subgraphs (1.24+)` };
  else {
  // the ssd sampler on an 8x8 grid with a new seed, moved into a subgraph, run again: its widget fills from the
  // events of execution id "<subgraph node>:<node>"
  result.subgraph = await page.evaluate(() => {
    const { app } = window;
    const n = app.graph.getNodeById(5);
    n.widgets.find((w) => w.name === "seed").value = 4242;
    n.widgets.find((w) => w.name === "grid").value = "8x8 (32x32 px, 1:1) reference";
    app.canvas.selectItems([n]);
    app.extensionManager.command.execute("Comfy.Graph.ConvertToSubgraph");
    const outer = app.graph._nodes.find((x) => x.subgraph);
    const inner = outer?.subgraph?.nodes?.find((x) => x.type === "SSDSampler");
    return { outer: outer?.id ?? null, inner: inner?.id ?? null };
  });
  await page.waitForTimeout(500);
  if (result.subgraph.outer !== null && result.subgraph.inner !== null) {
    const path = [result.subgraph.outer, result.subgraph.inner];
    await countLiveEvents(); // the page was reloaded since: listen again
    await page.evaluate(() => window.app.queuePrompt(0, 1));
    await page.waitForFunction((path) => {
      let graph = window.app.graph;
      let node = null;
      for (const id of path) { node = graph?.getNodeById(Number(id)); graph = node?.subgraph; }
      const t = node?.widgets?.find((x) => x.name === "ssd_grid")?.ssd?.state?.trace;
      return t?.done && t.grid[0] === 8 && t.seed === 4242;
    }, path, { timeout: TIMEOUT, polling: 250 });
    result.subgraphAfter = await nodeWidget(path);
    result.subgraphLive = await page.evaluate(() => window.__ssdLive);
    await page.screenshot({ path: join(OUT, "subgraph.png") });
  }
  }
  // the node's help (web/docs/SSDSampler.md, web/docs/SSDSampler/zh.md) in the frontend's own panel: the right
  // side panel's Info tab of the selected node (1.3x+), else the node library's help page (1.2x)
  step("help");
  result.help = { requests: [] };
  page.on("response", (r) => {
    if (r.url().includes(`/extensions/${PACK}/docs/`)) result.help.requests.push(`${r.status()} ${new globalThis.URL(r.url()).pathname}`);
  });
  for (const [locale, want] of [["en", "Which decoder?"], ["zh", "选哪个解码器"]]) {
    await page.evaluate((locale) => window.app.extensionManager.setting.set("Comfy.Locale", locale), locale);
    await page.waitForTimeout(300);
    // up to 3 tries: frontend 1.47 may drop the selection while it applies the new locale (the panel then shows
    // the workflow overview), so the node is selected and the panel opened again
    const box = ".node-help-content, .comfy-markdown-content"; // the help page's markdown (1.27, 1.58)
    let shown;
    for (let attempt = 1; attempt <= 3; attempt++) {
      shown = await page.evaluate(async () => {
        const { app } = window;
        const pinia = document.querySelector("#vue-app")?.__vue_app__?.config?.globalProperties?.$pinia;
        if (!pinia) return { error: "no pinia on #vue-app" };
        const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
        const node = app.graph._nodes.find((n) => n.type === "SSDSampler");
        const panel = pinia._s.get("rightSidePanel");
        if (panel) { // closed and opened again: the help is fetched (in the new locale) when its node changes
          panel.closePanel();
          app.canvas.deselectAll?.();
          await sleep(300);
          app.canvas.selectItems([node]);
          await sleep(100);
          panel.openPanel("info");
          return { via: "right side panel" };
        }
        const sb = pinia._s.get("sidebarTab");
        const id = sb?.sidebarTabs?.map((t) => t.id).find((t) => /node-library/.test(t));
        if (!id) return { error: "no node library tab" };
        if (sb.activeSidebarTabId !== id) sb.toggleSidebarTab(id);
        for (let i = 0; i < 50 && !pinia._s.get("nodeHelp"); i++) await sleep(100);
        const help = pinia._s.get("nodeHelp");
        if (!help) return { error: "no nodeHelp store" };
        help.closeHelp();
        await sleep(300);
        help.openHelp(pinia._s.get("nodeDef").nodeDefsByName.SSDSampler);
        return { via: "node library" };
      });
      shown.attempts = attempt;
      shown.found = await page.waitForFunction(({ box, want }) => [...document.querySelectorAll(box)]
        .some((e) => e.innerText.includes(want)), { box, want }, { timeout: 10000 }).then(() => true, () => false);
      if (shown.found || shown.error) break;
    }
    shown.headings = await page.evaluate((box) => [...new Set([...document.querySelectorAll(box)]
      .flatMap((e) => [...e.querySelectorAll("h1")].map((h) => h.innerText)))], box);
    result.help[locale] = shown;
    await page.screenshot({ path: join(OUT, `help_${locale}.png`) });
  }
  await page.evaluate(() => window.app.extensionManager.setting.set("Comfy.Locale", "en"));

  step("vue nodes");
  // the Vue node renderer (Nodes 2.0) draws its own number inputs: the auto values say so in their labels there
  const vueLabels = () => page.evaluate(() => {
    const el = document.querySelector('[data-node-id="3"]');
    if (!el) return null;
    const field = (name) => [...el.querySelectorAll('[data-testid="widget-layout-field-label"]')]
      .map((e) => e.innerText.trim()).find((t) => t === name || t.startsWith(name + " ")) ?? null;
    return { cfg: field("cfg"), draft_rows: field("draft_rows"), verify_rounds: field("verify_rounds"), seed: field("seed") };
  });
  await page.evaluate(() => window.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", true));
  const vue = { on: await page.waitForSelector('[data-node-id="3"]', { timeout: 15000 }).then(() => true, () => false) };
  await page.waitForTimeout(500);
  vue.before = await vueLabels();
  if (vue.on) { // a user types a value into cfg: its label drops "auto"
    // the input of the field whose label is cfg's (the inputs carry no name of their own)
    const input = page.locator('[data-node-id="3"] [data-testid="widget-layout-field-label"]', { hasText: /^cfg/ })
      .locator("xpath=ancestor::*[.//input][1]").locator("input").first();
    await input.fill("2.5").catch((e) => { vue.typeError = String(e).slice(0, 200); });
    await input.press("Enter").catch(() => {});
    await page.waitForTimeout(300);
    vue.typed = await vueLabels();
    vue.value = await page.evaluate(() => window.app.graph.getNodeById(3).widgets.find((w) => w.name === "cfg").value);
  }
  await page.screenshot({ path: join(OUT, "vue_nodes.png") });
  await page.evaluate(() => window.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", false));
  await page.waitForTimeout(300);
  vue.canvasLabel = await page.evaluate(() => window.app.graph.getNodeById(4).widgets.find((w) => w.name === "cfg").label ?? null);
  result.vueNodes = vue;
  result.packLogged.push(...(await packLogged()));
  step("done");
} catch (e) {
  result.error = String(e?.stack ?? e);
  await page.screenshot({ path: join(OUT, "failure.png") }).catch(() => {});
} finally {
  writeFileSync(join(OUT, "result.json"), JSON.stringify(result, null, 2));
  await context.close();
}
