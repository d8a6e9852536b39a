// Screenshot of te-align's ComfyUI nodes in ComfyUI's own web UI, in headless Chromium (the README's picture).
//
// Needs a ComfyUI server started by tools/comfyui_server.sh (te-align's nodes installed, the demo model files of
// tools/comfyui_demo_models.py) and playwright-core (npm) on NODE_PATH. It opens the UI, builds the workflow with
// the UI's own graph API (CLIPLoader -> te-align Text Encode by name and "from LoRA", te-align Empty Negative; each
// node's profile line into a Preview Any), queues it, waits until the server says the prompt ran, and saves the page.
//
// With "error" as the last argument the workflow holds a user mistake instead ("from LoRA" with no LoRA chosen) and
// the picture shows the one line ComfyUI reports for it.
//
//   NODE_PATH=<folder with node_modules> node tools/comfyui_screenshot.cjs <url> <out.png> [chromium executable] [error]
"use strict";

const { chromium } = require("playwright-core");

async function main() {
  const [url, out, executable, which] = process.argv.slice(2);
  const mistake = which === "error";
  if (!url || !out) {
    console.error("usage: node tools/comfyui_screenshot.cjs <url> <out.png> [chromium executable] [error]");
    process.exit(2);
  }
  const userDataDir = require("fs").mkdtempSync(require("path").join(require("os").tmpdir(), "te-align-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: executable || "chromium",
    headless: true,
    viewport: { width: 1680, height: 900 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run"],
  });
  const page = context.pages()[0] || (await context.newPage());
  page.on("pageerror", (e) => console.error("page error:", e.message));
  // a fresh ComfyUI user gets the templates browser and the minimap; this user has seen them
  for (const [id, value] of [["Comfy.TutorialCompleted", true], ["Comfy.Minimap.Visible", false]]) {
    await page.request.post(`${url}/settings/${id}`, { data: JSON.stringify(value) });
  }
  await page.goto(url, { waitUntil: "networkidle" });
  await page.waitForFunction(() => window.app && window.app.graph && window.LiteGraph, null, { timeout: 120000 });
  await page.waitForTimeout(2000);
  await page.evaluate(async (mistake) => {
    const { app, LiteGraph } = window;
    app.graph.clear();
    const add = (type, pos, size, widgets = {}) => {
      const n = LiteGraph.createNode(type);
      if (!n) throw new Error(`node type ${type} is not registered`);
      n.pos = pos;
      app.graph.add(n);
      if (size) n.size = size;
      for (const [name, value] of Object.entries(widgets)) {
        const w = n.widgets.find((x) => x.name === name);
        if (!w) throw new Error(`${type} has no widget ${name}`);
        w.value = value;
      }
      return n;
    };
    const clip = add("CLIPLoader", [0, 300], [330, 110],
                     { clip_name: "clip_l-random.safetensors", type: "stable_diffusion" });
    if (mistake) {  // "from LoRA" with no LoRA chosen: the one-line message a user gets
      const node = add("TeAlignTextEncode", [380, 200], [400, 250], { profile: "from LoRA", text: "a photo of a cat" });
      clip.connect(0, node, 0);
      node.connect(1, add("PreviewAny", [830, 200], [700, 150]), 0);
      app.canvas.ds.scale = 0.95;
      app.canvas.ds.offset = [110, 75];
      app.graph.setDirtyCanvas(true, true);
      await app.queuePrompt(0, 1);
      return;
    }
    const byName = add("TeAlignTextEncode", [380, 0], [400, 250], { profile: "sd15", text: "a photo of a cat" });
    const fromLora = add("TeAlignTextEncode", [380, 300], [400, 250],
                         { profile: "from LoRA", text: "a photo of a cat", lora_name: "lora-without-metadata.safetensors" });
    const negative = add("TeAlignEmptyNegative", [380, 600], [400, 190], { profile: "sd15" });
    for (const n of [byName, fromLora, negative]) clip.connect(0, n, 0);
    for (const n of [byName, fromLora, negative]) {
      const show = add("PreviewAny", [830, n.pos[1]], [700, 150]);
      n.connect(1, show, 0);
    }
    app.canvas.ds.scale = 0.95;
    app.canvas.ds.offset = [110, 75];
    app.graph.setDirtyCanvas(true, true);
    await app.queuePrompt(0, 1);
  }, mistake);
  // the prompt has run when the server's history has it
  const deadline = Date.now() + 180000;
  for (;;) {
    const history = await page.evaluate(async () => (await fetch("/history")).json());
    const done = Object.values(history).some((h) => h.status && (h.status.completed || h.status.status_str === "error"));
    if (done) break;
    if (Date.now() > deadline) throw new Error("the workflow did not finish within 180 s");
    await page.waitForTimeout(1000);
  }
  if (!mistake) await page.keyboard.press("Escape");  // (a mistake's run keeps ComfyUI's error dialog open)
  await page.waitForTimeout(2000);
  await page.screenshot({ path: out });
  console.log(`saved ${out}`);
  await context.close();
  require("fs").rmSync(userDataDir, { recursive: true, force: true });
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
