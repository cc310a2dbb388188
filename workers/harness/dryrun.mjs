#!/usr/bin/env node
// Validates a Worker project with the pinned local wrangler, offline:
//
//   node workers/harness/dryrun.mjs DIR [extra wrangler args...]
//
// DIR holds wrangler.toml and the module it names in `main`. Runs
//   wrangler deploy --dry-run --outdir <fresh temp dir>
// in DIR, prints wrangler's output (stdout to stdout, stderr to stderr) and exits with
// wrangler's exit status (2 if wrangler could not be started). With --dry-run wrangler
// bundles and validates the configuration (e.g. it rejects a [[ratelimits]] period other
// than 10 or 60) without calling the Cloudflare API, so no credentials are needed.
//
// Environment given to wrangler, so that it never reaches the network or needs an account:
//   WRANGLER_SEND_METRICS=false         no telemetry
//   WRANGLER_SEND_ERROR_REPORTS=false   no crash reports
//   WRANGLER_HIDE_BANNER=true           the banner is what runs the npm "update available"
//                                       check; hiding it skips that request
//   CLOUDFLARE_API_TOKEN, CLOUDFLARE_API_KEY, CLOUDFLARE_EMAIL, CLOUDFLARE_ACCOUNT_ID unset
//   WRANGLER_LOG_PATH, XDG_CONFIG_HOME  inside the temp dir, so nothing is written to $HOME
// Wrangler still writes DIR/.wrangler/tmp while bundling; the script removes DIR/.wrangler
// afterwards unless it existed before.
//
// Set DRYRUN_KEEP_OUTDIR=1 to keep the temp dir (its path is printed to stderr).

import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const wrangler = path.resolve(here, "..", "node_modules", ".bin", "wrangler");

const [dirArg, ...extra] = process.argv.slice(2);
if (!dirArg) {
  process.stderr.write("usage: dryrun.mjs DIR [extra wrangler args...]\n");
  process.exit(2);
}
const dir = path.resolve(dirArg);
if (!fs.existsSync(wrangler)) {
  process.stderr.write(`dryrun: ${wrangler} not found; run: npm ci --prefix workers\n`);
  process.exit(2);
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "edgegen-dryrun-"));
const outdir = path.join(tmp, "out");
const dotWrangler = path.join(dir, ".wrangler");
const hadDotWrangler = fs.existsSync(dotWrangler);

const env = { ...process.env };
for (const name of ["CLOUDFLARE_API_TOKEN", "CLOUDFLARE_API_KEY", "CLOUDFLARE_EMAIL", "CLOUDFLARE_ACCOUNT_ID"]) {
  delete env[name];
}
Object.assign(env, {
  WRANGLER_SEND_METRICS: "false",
  WRANGLER_SEND_ERROR_REPORTS: "false",
  WRANGLER_HIDE_BANNER: "true",
  WRANGLER_LOG_PATH: path.join(tmp, "logs"),
  XDG_CONFIG_HOME: path.join(tmp, "config"),
  NO_COLOR: "1",
  FORCE_COLOR: "0",
});

const result = spawnSync(wrangler, ["deploy", "--dry-run", "--outdir", outdir, ...extra], {
  cwd: dir,
  env,
  stdio: ["ignore", "inherit", "inherit"],
});

if (!hadDotWrangler) fs.rmSync(dotWrangler, { recursive: true, force: true });
if (process.env.DRYRUN_KEEP_OUTDIR === "1") {
  process.stderr.write(`dryrun: output kept in ${tmp}\n`);
} else {
  fs.rmSync(tmp, { recursive: true, force: true });
}

if (result.error) {
  process.stderr.write(`dryrun: could not run wrangler: ${result.error.message}\n`);
  process.exit(2);
}
process.exit(result.status ?? 2);
