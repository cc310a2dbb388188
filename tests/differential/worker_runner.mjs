#!/usr/bin/env node
// Runs the generated Worker in workerd (through the pinned Miniflare in workers/node_modules)
// for the differential suite, and reports for each request what the Worker did.
//
// stdin: one job
//   {
//     "workers": "/abs/path/to/workers",        // where node_modules/miniflare is
//     "script": "/abs/path/to/entry.js",        // the entry module (see runners.py)
//     "compatibilityDate": "2025-01-01",
//     "ratelimits": {"RL_X": {"simple": {"limit": 100000, "period": 60}}},
//     "probes": [["2001:db8::1", 64], ...],     // ipBucket(ip, prefix) calls
//     "requests": [{"url": "https://host/path", "method": "GET", "headers": {...}}],
//     "concurrency": 8
//   }
// stdout: {"buckets": [...] | null, "responses": [{"status", "originUrl", "originMethod",
//          "consulted": [{"limit", "key"}], "error"?}]}
//
// The entry module is the generated worker.js with its default export renamed, plus an
// entry point that hands the Worker an env whose rate-limit bindings record each call
// (limit name and key) before passing it to the real binding, and that answers the probe
// request (header x-differential-probe) with ipBucket() of each probe, or null when the
// Worker has no ipBucket. The origin (Miniflare's outboundService) answers every request
// with the URL and method it received, in headers, so HEAD answers carry them too.

import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

console.log = console.error;
console.info = console.error;

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

async function loadMiniflare(workers) {
  const require = createRequire(path.join(workers, "package.json"));
  const resolved = require.resolve("miniflare");
  return (await import(pathToFileURL(resolved).href)).Miniflare;
}

async function origin(request) {
  return new Response(null, {
    status: 200,
    headers: { "x-origin-url": request.url, "x-origin-method": request.method },
  });
}

async function send(mf, req) {
  try {
    const res = await mf.dispatchFetch(req.url, {
      method: req.method,
      headers: req.headers,
      redirect: "manual",
    });
    const body = await res.text();
    const consulted = res.headers.get("x-differential-consulted");
    const problem = (res.headers.get("content-type") ?? "").startsWith("application/problem+json");
    return {
      status: res.status,
      detail: problem ? (JSON.parse(body).detail ?? null) : null,
      originUrl: res.headers.get("x-origin-url"),
      originMethod: res.headers.get("x-origin-method"),
      consulted: consulted === null ? null : JSON.parse(consulted),
      error: res.headers.get("x-differential-error"),
    };
  } catch (err) {
    return {
      status: 0,
      detail: null,
      originUrl: null,
      originMethod: null,
      consulted: null,
      error: String(err),
    };
  }
}

async function main() {
  const job = await readStdin();
  const Miniflare = await loadMiniflare(job.workers);
  const ratelimits = {};
  for (const [name, conf] of Object.entries(job.ratelimits)) {
    ratelimits[name] = { simple: { limit: conf.simple.limit, period: conf.simple.period } };
  }
  const mf = new Miniflare({
    cf: false,
    handleRuntimeStdio(stdout, stderr) {
      stdout.pipe(process.stderr);
      stderr.pipe(process.stderr);
    },
    modules: true,
    scriptPath: path.resolve(job.script),
    modulesRoot: path.dirname(path.resolve(job.script)),
    compatibilityDate: job.compatibilityDate,
    ratelimits,
    stripCfConnectingIp: false,
    outboundService: origin,
  });
  try {
    await mf.ready;
    const probe = await mf.dispatchFetch("https://probe.invalid/", {
      method: "POST",
      headers: { "x-differential-probe": "1" },
      body: JSON.stringify(job.probes),
    });
    const buckets = (await probe.json()).buckets;
    const responses = new Array(job.requests.length);
    let next = 0;
    async function lane() {
      while (next < job.requests.length) {
        const index = next++;
        responses[index] = await send(mf, job.requests[index]);
      }
    }
    await Promise.all(Array.from({ length: job.concurrency ?? 8 }, lane));
    await new Promise((resolve) => {
      process.stdout.write(JSON.stringify({ buckets, responses }) + "\n", resolve);
    });
  } finally {
    await mf.dispose();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`worker_runner: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
