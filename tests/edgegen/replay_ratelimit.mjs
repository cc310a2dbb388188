#!/usr/bin/env node
// Drives Miniflare's ratelimit binding (in workerd) through a list of calls at chosen
// times, for tests/edgegen/test_replay_models.py.
//
// stdin:  {"limit": 3, "period": 10, "calls": [[ms since the epoch, key], ...]}
// stdout: {"successes": [true, false, ...]}, one per call, in order.
//
// The binding reads the time with Date.now(). It runs in the isolate of the Worker that
// uses it, so the Worker below sets Date.now to the call's time (from a request header)
// before each limit() call: the binding's windows then turn over exactly where the trace
// says, whatever the wall clock. Run with the working directory workers/ (run_node does),
// where the pinned miniflare is installed.

import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.cwd(), "package.json"));
const { Miniflare } = await import(require.resolve("miniflare"));

const WORKER = `
export default {
  async fetch(request, env) {
    const at = Number(request.headers.get("x-at"));
    Date.now = () => at;
    const { success } = await env.RL.limit({ key: request.headers.get("x-key") });
    return Response.json({ success, now: Date.now() });
  },
};
`;

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const mf = new Miniflare({
  modules: true,
  script: WORKER,
  compatibilityDate: "2025-01-01",
  ratelimits: { RL: { simple: { limit: job.limit, period: job.period } } },
});
try {
  const successes = [];
  for (const [at, key] of job.calls) {
    const response = await mf.dispatchFetch("http://replay.test/", {
      headers: { "x-at": String(at), "x-key": key },
    });
    const body = await response.json();
    if (body.now !== at) {
      throw new Error(`the Worker's clock read ${body.now}, not ${at}`);
    }
    successes.push(body.success);
  }
  process.stdout.write(JSON.stringify({ successes }));
} finally {
  await mf.dispose();
}
