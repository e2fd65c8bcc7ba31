// Drives pi's own RpcClient through one scenario and prints what it sees, one JSON line each:
//   {"kind":"event","t":ms,"event":{...}}                       every event the client delivers
//   {"kind":"call","t":ms,"label","method","ok":true,"value"}   a client method that resolved
//   {"kind":"call","t":ms,"label","method","ok":false,"error"}  one that threw
//   {"kind":"done"} / {"kind":"fail","error"}
// Usage: node driver.mjs SCENARIO.json, with
//   PI_RPC_CLIENT  path of @mariozechner/pi-coding-agent's dist/modes/rpc/rpc-client.js
//   DRIVER_CLIENT  JSON options for new RpcClient(...) (cliPath, provider, model, args, env, cwd)
// Steps: {"call": METHOD, "args": [...], "label"}, {"wait": {partial event}, "timeout_ms"},
// {"sleep_ms": N}, {"settle": {"quiet_ms": N}} (the agent is idle: every agent_start has
// its agent_end, every auto_retry_start its next agent_start or auto_retry_end, nothing
// arrived for quiet_ms; a wait for the prompt's first event belongs before it, since a turn
// that has not started yet also looks idle).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { RpcClient } = await import(pathToFileURL(process.env.PI_RPC_CLIENT).href);
const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
const client = new RpcClient(JSON.parse(process.env.DRIVER_CLIENT));
const t0 = Date.now();
const events = [];
let lastEventAt = Date.now();
const print = (obj) => process.stdout.write(JSON.stringify({ ...obj, t: Date.now() - t0 }) + "\n");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

client.onEvent((event) => {
  events.push(event);
  lastEventAt = Date.now();
  print({ kind: "event", event });
});

function matches(event, pattern) {
  return Object.entries(pattern).every(([k, v]) => event[k] === v);
}

function idle() {
  let open = false;
  let backoff = false;
  for (const e of events) {
    if (e.type === "agent_start") { open = true; backoff = false; }
    else if (e.type === "agent_end") open = false;
    else if (e.type === "auto_retry_start") backoff = true;
    else if (e.type === "auto_retry_end") backoff = false;
  }
  return !open && !backoff;
}

async function run() {
  let cursor = 0;
  await client.start();
  for (const step of scenario.steps) {
    if (step.call) {
      const label = step.label ?? step.call;
      try {
        const value = await client[step.call](...(step.args ?? []));
        print({ kind: "call", label, method: step.call, ok: true, value: value ?? null });
      } catch (err) {
        print({ kind: "call", label, method: step.call, ok: false, error: String(err?.message ?? err) });
      }
    } else if (step.wait) {
      const deadline = Date.now() + (step.timeout_ms ?? 60000);
      for (;;) {
        const i = events.findIndex((e, j) => j >= cursor && matches(e, step.wait));
        if (i >= 0) { cursor = i + 1; break; }
        if (Date.now() > deadline) throw new Error(`timeout waiting for ${JSON.stringify(step.wait)}`);
        await sleep(2);
      }
    } else if (step.sleep_ms !== undefined) {
      await sleep(step.sleep_ms);
    } else if (step.settle) {
      const quiet = step.settle.quiet_ms ?? 150;
      const deadline = Date.now() + (step.timeout_ms ?? 60000);
      while (!(idle() && Date.now() - lastEventAt >= quiet)) {
        if (Date.now() > deadline) throw new Error("timeout waiting for the agent to be idle");
        await sleep(5);
      }
      cursor = events.length;
    } else {
      throw new Error(`unknown step ${JSON.stringify(step)}`);
    }
  }
}

try {
  await run();
  print({ kind: "done" });
} catch (err) {
  print({ kind: "fail", error: String(err?.stack ?? err) });
} finally {
  await client.stop();
}
