#!/usr/bin/env node
// Runs a Worker module in the real workerd runtime (through Miniflare) and replays a list
// of requests against it. Used by the Python tests; see workers/README.md.
//
// stdin:  one job object, or a JSON array of job objects.
//   {
//     "script": "/abs/path/to/module.js",          // ES module Worker (export default { fetch })
//     "compatibilityDate": "2025-01-01",           // optional, default below
//     "compatibilityFlags": [],                    // optional
//     "ratelimits": {                              // wrangler-style [[ratelimits]] by binding name
//       "RL_X": {"namespace_id": "1001", "simple": {"limit": 5, "period": 60}}
//     },
//     "vars": {"NAME": "value"},                   // optional plain env vars
//     "modulesRoot": "/abs/dir",                   // optional, default: the script's directory
//     "cf": {"country": "US"},                    // optional request.cf object (default:
//                                                  //   Miniflare's built-in fallback, no network)
//     "stripCfConnectingIp": false,                // optional, see "Outbound requests" below
//     "windowGuardMs": 2000,                       // optional, see "Rate limit windows" below
//     "outbound": {                                // optional canned answers to the Worker's
//       "https://auth.example.com/jwks.json":      //   own fetches, by exact URL (see
//         {"status": 200, "body": "...",           //   "Outbound requests")
//          "headers": {}, "delayMs": 0}
//     },
//     "requests": [
//       {"url": "https://api.example.com/login", "method": "POST",
//        "headers": {"cf-connecting-ip": "1.2.3.4"}, "body": null}
//     ]
//   }
// stdout: for a single job   {"responses": [...], "windowCrossed": false, "fetched": {}}
//         for an array       {"results": [{"responses": [...], "windowCrossed": false}, ...]}
//   each response is {"status": 200, "headers": {...lower-case names}, "body": "text"}; if the
//   Worker threw, the entry is {"status": 500, "headers": {}, "body": "", "exception":
//   {"name", "message", "stack"}} (production would answer 500 / error 1101).
// On a harness error (bad job, Miniflare failed to start, ...) it prints
//   {"error": {"message", "stack", "job"}} to stderr and exits 1. Exit 0 otherwise.
// Output of the Worker's console.* and of workerd goes to stderr, never to stdout.
//
// Request headers are exact. Miniflare's entry worker rewrites incoming requests: it adds
// `CF-Connecting-IP: 127.0.0.1` (the loopback peer) whenever the request has no
// CF-Connecting-IP header, overwrites Accept-Encoding with "br, gzip", and undici adds
// accept, accept-language, sec-fetch-mode and user-agent. Miniflare has no option to turn
// the CF-Connecting-IP injection off (`stripCfConnectingIp` only affects OUTBOUND fetches).
// So the runner puts a tiny front Worker (FRONT_WORKER below) in front of the Worker under
// test: the runner sends the job's header list, base64-encoded JSON, in the control header
// `x-harness-headers`; the front Worker replaces ALL headers with exactly that list and
// forwards the request to the Worker under test over a service binding. The Worker under
// test therefore sees exactly the headers of the job, plus `host` taken from the URL when
// the job does not give one. A request without "cf-connecting-ip" in its headers reaches
// the Worker with no CF-Connecting-IP header at all; give {"cf-connecting-ip": "1.2.3.4"}
// to send one. The URL, method, body and `request.cf` pass through unchanged.
//
// Outbound requests. The Worker's `fetch(request)` (its global outbound) is routed by
// Miniflare to `outboundService`, a Node function standing in for the origin: it answers 200
// with header `x-origin: 1` and a JSON body {"method", "url", "headers", "body"} echoing what
// it received; a request carrying `x-origin-status: 401` gets that status instead of 200
// (for limits that count only some answers). By default Miniflare strips CF-Connecting-IP from outbound fetches and adds
// `CF-Worker: <zone>`, emulating a cross-zone subrequest; the runner turns that off
// (stripCfConnectingIp: false) so the echo shows the request exactly as the Worker sent it.
// Set "stripCfConnectingIp": true in a job to get Miniflare's default. A fetch of a URL
// listed in the job's "outbound" gets that canned answer instead (after "delayMs"), such as
// a JWKS the Worker reads; "fetched" in the result counts the fetches of each listed URL.
//
// Rate limit windows. Miniflare emulates a ratelimit binding with a fixed window per binding:
// counters are in memory, keyed by the `key` passed to limit(), and all cleared when
// floor(Date.now() / period) changes; period must be 10 or 60. So a job that straddles a
// window boundary sees its counters reset. Before the first request the runner waits for
// the next boundary if one of the job's periods would end within windowGuardMs (default
// 2000), and reports "windowCrossed": true if a boundary was crossed anyway during the job.
// Each job gets a fresh Miniflare instance, hence fresh counters. namespace_id is not used
// by Miniflare (it keys by binding name), so two bindings never share counters here.

import path from "node:path";

import { Miniflare } from "miniflare";

const DEFAULT_COMPATIBILITY_DATE = "2025-01-01";
const DEFAULT_WINDOW_GUARD_MS = 2000;
const CONTROL_HEADER = "x-harness-headers";
const EXCEPTION_HEADER = "x-harness-exception";
const ORIGIN_STATUS_HEADER = "x-origin-status";

// Keep stdout for the result document only.
console.log = console.error;
console.info = console.error;

const FRONT_WORKER = `
export default {
  async fetch(request, env) {
    const encoded = request.headers.get(${JSON.stringify(CONTROL_HEADER)});
    if (encoded === null) {
      return new Response("harness: missing control header", { status: 400 });
    }
    const bytes = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
    const list = JSON.parse(new TextDecoder().decode(bytes));
    const headers = new Headers();
    for (const [name, value] of list) headers.append(name, value);
    try {
      return await env.TARGET.fetch(new Request(request, { headers }));
    } catch (err) {
      const exception = { name: err?.name ?? "Error", message: String(err?.message ?? err), stack: err?.stack ?? null };
      return new Response(JSON.stringify(exception), {
        status: 500,
        headers: { ${JSON.stringify(EXCEPTION_HEADER)}: "1", "content-type": "application/json" },
      });
    }
  },
};
`;

function fail(err, jobIndex) {
  const error = {
    message: err && err.message ? err.message : String(err),
    stack: err && err.stack ? String(err.stack) : null,
    job: jobIndex ?? null,
  };
  process.stderr.write(JSON.stringify({ error }) + "\n");
  process.exit(1);
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// The status the origin answers: the request's `x-origin-status` header when it holds one
// from 200 to 599 (a test's stand-in for a failed login, say), else 200.
function originStatus(request) {
  const wanted = Number(request.headers.get(ORIGIN_STATUS_HEADER));
  return Number.isInteger(wanted) && wanted >= 200 && wanted <= 599 ? wanted : 200;
}

function toMiniflareRatelimits(ratelimits) {
  const out = {};
  for (const [binding, conf] of Object.entries(ratelimits ?? {})) {
    if (!conf || typeof conf !== "object" || !conf.simple) {
      throw new Error(`ratelimits.${binding}: expected {"simple": {"limit", "period"}}`);
    }
    out[binding] = { simple: { limit: conf.simple.limit, period: conf.simple.period } };
  }
  return out;
}

function periodsOf(ratelimits) {
  return [...new Set(Object.values(ratelimits).map((r) => r.simple.period).filter(Boolean))];
}

function windowIds(periods, now) {
  return periods.map((p) => Math.floor(now / (p * 1000)));
}

async function waitForWindowRoom(periods, guardMs) {
  let wait = 0;
  const now = Date.now();
  for (const p of periods) {
    const left = p * 1000 - (now % (p * 1000));
    if (left < guardMs) wait = Math.max(wait, left + 50);
  }
  if (wait > 0) await sleep(wait);
}

function headerList(req) {
  const url = new URL(req.url);
  const list = [];
  let hasHost = false;
  for (const [name, value] of Object.entries(req.headers ?? {})) {
    const values = Array.isArray(value) ? value : [value];
    for (const v of values) list.push([name.toLowerCase(), String(v)]);
    if (name.toLowerCase() === "host") hasHost = true;
  }
  if (!hasHost) list.unshift(["host", url.host]);
  return list;
}

function outboundService(canned, fetched) {
  return async (request) => {
    const answer = canned[request.url];
    if (answer === undefined) {
      return origin(request);
    }
    fetched[request.url] = (fetched[request.url] ?? 0) + 1;
    if (answer.delayMs) {
      await sleep(answer.delayMs);
    }
    return new Response(answer.body ?? "", {
      status: answer.status ?? 200,
      headers: answer.headers ?? { "content-type": "application/json" },
    });
  };
}

async function origin(request) {
  const body = request.body === null ? null : await request.text();
  return new Response(
    JSON.stringify({
      method: request.method,
      url: request.url,
      headers: Object.fromEntries(request.headers),
      body,
    }),
    {
      status: originStatus(request),
      headers: { "content-type": "application/json", "x-origin": "1" },
    },
  );
}

async function runJob(job) {
  if (!job || typeof job !== "object") throw new Error("job must be an object");
  if (typeof job.script !== "string") throw new Error("job.script must be a path string");
  if (!Array.isArray(job.requests)) throw new Error("job.requests must be an array");
  const ratelimits = toMiniflareRatelimits(job.ratelimits);
  const compatibilityDate = job.compatibilityDate ?? DEFAULT_COMPATIBILITY_DATE;
  const compatibilityFlags = job.compatibilityFlags ?? [];
  const fetched = {};

  const mf = new Miniflare({
    // Without this Miniflare downloads a request.cf object from the network at start-up.
    // false uses Miniflare's built-in fallback object; a job may give its own "cf".
    cf: job.cf ?? false,
    handleRuntimeStdio(stdout, stderr) {
      stdout.pipe(process.stderr);
      stderr.pipe(process.stderr);
    },
    workers: [
      {
        name: "harness-front",
        modules: true,
        script: FRONT_WORKER,
        compatibilityDate,
        serviceBindings: { TARGET: "worker" },
      },
      {
        name: "worker",
        modules: true,
        scriptPath: path.resolve(job.script),
        // Module names are paths relative to modulesRoot, and workerd refuses names with
        // "..": root them at the script's own directory (imports must stay below it).
        modulesRoot: path.resolve(job.modulesRoot ?? path.dirname(job.script)),
        compatibilityDate,
        compatibilityFlags,
        ratelimits,
        bindings: job.vars ?? {},
        stripCfConnectingIp: job.stripCfConnectingIp ?? false,
        outboundService: outboundService(job.outbound ?? {}, fetched),
      },
    ],
  });
  try {
    await mf.ready;
    const periods = periodsOf(ratelimits);
    await waitForWindowRoom(periods, job.windowGuardMs ?? DEFAULT_WINDOW_GUARD_MS);
    const startWindows = windowIds(periods, Date.now());
    const responses = [];
    for (const req of job.requests) {
      const list = headerList(req);
      const encoded = Buffer.from(JSON.stringify(list), "utf8").toString("base64");
      const init = {
        method: req.method ?? "GET",
        headers: { [CONTROL_HEADER]: encoded },
        redirect: "manual",
      };
      if (req.body !== null && req.body !== undefined) init.body = req.body;
      // The front Worker turns exceptions of the Worker under test into a marked response,
      // so a rejection here is a harness error (bad request in the job, runtime gone, ...).
      const res = await mf.dispatchFetch(req.url, init);
      if (res.headers.get(EXCEPTION_HEADER) === "1") {
        responses.push({ status: 500, headers: {}, body: "", exception: await res.json() });
        continue;
      }
      const headers = {};
      res.headers.forEach((value, name) => {
        // dispatchFetch decodes compressed bodies and renames Content-Encoding to
        // MF-Content-Encoding; the body here is always decoded text, so drop it.
        if (name !== "mf-content-encoding") headers[name] = value;
      });
      responses.push({ status: res.status, headers, body: await res.text() });
    }
    const endWindows = windowIds(periods, Date.now());
    const windowCrossed = startWindows.some((w, i) => w !== endWindows[i]);
    return { responses, windowCrossed, fetched };
  } finally {
    await mf.dispose();
  }
}

async function main() {
  let input;
  try {
    input = JSON.parse(await readStdin());
  } catch (err) {
    fail(new Error(`stdin is not a JSON job: ${err.message}`));
  }
  const jobs = Array.isArray(input) ? input : [input];
  const results = [];
  for (let i = 0; i < jobs.length; i++) {
    try {
      results.push(await runJob(jobs[i]));
    } catch (err) {
      fail(err, i);
    }
  }
  const doc = Array.isArray(input) ? { results } : results[0];
  process.stdout.write(JSON.stringify(doc) + "\n", () => process.exit(0));
}

main().catch((err) => fail(err));
