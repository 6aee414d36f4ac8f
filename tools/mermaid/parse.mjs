// Parse Mermaid files with the pinned mermaid package: `node tools/mermaid/parse.mjs FILE...`.
//
// Prints `ok FILE (diagram type)` or `FAIL FILE: error` per file; exits 1 if any failed,
// 2 on a usage error. mermaid.parse needs a DOM (DOMPurify) even in node: jsdom gives it
// one. For a gantt chart, parse alone accepts any task data, so the tasks are also
// computed (the step a render does first) and each must have a start and an end no
// earlier than its start.
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node parse.mjs FILE...");
  process.exit(2);
}
const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });

async function check(text) {
  const parsed = await mermaid.parse(text);
  if (parsed.diagramType === "gantt") {
    const diagram = await mermaid.mermaidAPI.getDiagramFromText(text);
    const tasks = diagram.db.getTasks();
    for (const task of tasks) {
      const start = task.startTime?.valueOf?.();
      const end = task.endTime?.valueOf?.();
      if (!Number.isFinite(start) || !Number.isFinite(end) || end < start) {
        throw new Error(`gantt task ${JSON.stringify(task.task)} has start ${start}, end ${end}`);
      }
    }
    return `${parsed.diagramType}, ${tasks.length} tasks`;
  }
  return parsed.diagramType;
}

let failed = 0;
for (const file of files) {
  try {
    console.log(`ok ${file} (${await check(readFileSync(file, "utf8"))})`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL ${file}: ${String(error?.message ?? error).split("\n").slice(0, 4).join(" | ")}`);
  }
}
process.exit(failed ? 1 : 0);
