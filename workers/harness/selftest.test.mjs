// End-to-end check of the harness with the sample Worker: run.mjs in workerd, and
// dryrun.mjs with the pinned wrangler. Run with: npm test --prefix workers
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const sampleWorker = path.join(here, "sample-worker.js");
const sampleToml = path.join(here, "sample-wrangler.toml");
const RATELIMITS = { RL_SAMPLE: { namespace_id: "1001", simple: { limit: 5, period: 60 } } };

function run(input) {
  const res = spawnSync(process.execPath, [path.join(here, "run.mjs")], {
    input: JSON.stringify(input),
    encoding: "utf8",
  });
  return { code: res.status, stdout: res.stdout, stderr: res.stderr };
}

function runOk(input) {
  const res = run(input);
  assert.equal(res.code, 0, res.stderr);
  return JSON.parse(res.stdout);
}

function login(ip) {
  const headers = { "content-type": "application/json", "x-trace": "t-1" };
  if (ip !== undefined) headers["cf-connecting-ip"] = ip;
  return { url: "https://api.example.com/login?next=%2F", method: "POST", headers, body: '{"user":"a"}' };
}

function job(requests) {
  return { script: sampleWorker, compatibilityDate: "2025-01-01", ratelimits: RATELIMITS, requests };
}

function runCounting(input) {
  // A job that straddles a rate-limit window sees its counters reset; retry once.
  let doc = runOk(input);
  if (doc.windowCrossed) doc = runOk(input);
  assert.equal(doc.windowCrossed, false);
  return doc;
}

test("5 allowed then 429 per IP, other IP allowed, origin sees the request unchanged", () => {
  const requests = [...Array(6)].map(() => login("1.2.3.4"));
  requests.push(login("5.6.7.8"));
  const { responses } = runCounting(job(requests));
  assert.deepEqual(
    responses.map((r) => r.status),
    [200, 200, 200, 200, 200, 429, 200],
  );
  for (const r of [...responses.slice(0, 5), responses[6]]) {
    assert.equal(r.headers["x-origin"], "1");
  }
  const echo = JSON.parse(responses[0].body);
  assert.equal(echo.method, "POST");
  assert.equal(echo.url, "https://api.example.com/login?next=%2F");
  assert.equal(echo.body, '{"user":"a"}');
  assert.deepEqual(echo.headers, {
    "cf-connecting-ip": "1.2.3.4",
    "content-type": "application/json",
    host: "api.example.com",
    "x-trace": "t-1",
  });
  assert.equal(responses[5].body, "rate limited\n");
  assert.equal(responses[5].headers["retry-after"], "60");
  assert.equal(JSON.parse(responses[6].body).headers["cf-connecting-ip"], "5.6.7.8");
});

test("a request without CF-Connecting-IP reaches the Worker without one", () => {
  const { responses } = runOk(job([login(undefined)]));
  assert.equal(responses[0].status, 200);
  assert.equal(responses[0].headers["x-sample-ip"], "none");
  assert.equal("cf-connecting-ip" in JSON.parse(responses[0].body).headers, false);
});

test("an array of jobs gives one result each, with fresh counters per job", () => {
  const first = [...Array(6)].map(() => login("9.9.9.9"));
  const doc = runOk([job(first), job([login("9.9.9.9")])]);
  assert.equal(doc.results.length, 2);
  const [a, b] = doc.results;
  if (!a.windowCrossed) assert.equal(a.responses[5].status, 429);
  assert.equal(b.responses[0].status, 200);
});

test("a Worker exception is reported, not fatal", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "harness-selftest-"));
  try {
    const script = path.join(dir, "throws.js");
    fs.writeFileSync(script, 'export default { async fetch() { throw new TypeError("boom"); } };\n');
    const { responses } = runOk({ script, requests: [{ url: "https://a.example/" }] });
    assert.equal(responses[0].status, 500);
    assert.equal(responses[0].exception.name, "TypeError");
    assert.equal(responses[0].exception.message, "boom");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a harness error prints JSON on stderr and exits non-zero", () => {
  const bad = run({ script: "/nonexistent/worker.js", requests: [] });
  assert.notEqual(bad.code, 0);
  assert.equal(bad.stdout, "");
  assert.match(JSON.parse(bad.stderr.trim().split("\n").pop()).error.message, /ENOENT/);

  const badPeriod = run({ ...job([]), ratelimits: { RL_SAMPLE: { simple: { limit: 5, period: 30 } } } });
  assert.notEqual(badPeriod.code, 0);
});

function dryrun(period) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "harness-dryrun-"));
  try {
    fs.copyFileSync(sampleWorker, path.join(dir, "sample-worker.js"));
    const toml = fs.readFileSync(sampleToml, "utf8").replace("period = 60", `period = ${period}`);
    fs.writeFileSync(path.join(dir, "wrangler.toml"), toml);
    const res = spawnSync(process.execPath, [path.join(here, "dryrun.mjs"), dir], { encoding: "utf8" });
    return { code: res.status, output: res.stdout + res.stderr };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test("wrangler --dry-run accepts period 60 and rejects period 30", () => {
  const ok = dryrun(60);
  assert.equal(ok.code, 0, ok.output);
  assert.match(ok.output, /RL_SAMPLE \(5 requests\/60s\)/);
  assert.match(ok.output, /--dry-run: exiting now/);

  const bad = dryrun(30);
  assert.notEqual(bad.code, 0);
  assert.match(bad.output, /"simple\.period" must be either 10 or 60 but got 30/);
});
