// Keys beyond the address, included verbatim by worker.js.j2 after limiter.js, and only when
// a limit in the Worker counts by a header, a cookie or a JWT claim (`per` in the policy).
//
// A limit's `key` (from CONFIG) says where its value is. The binding never sees the value:
// it counts "k:" and a keyed hash of it (HMAC-SHA-256 with the secret named by
// CONFIG.keySecret, which the user sets with `wrangler secret put`), so no credential is
// ever a counter's name, and no value is ever logged or echoed. A request without the key,
// with a token that fails verification, or in a Worker whose hash secret is not set, is
// counted by client IP (`keyedCounters` falls back to the address key). A verified caller
// whose token names a tier the limit holds at the edge (`edge.tiers`) is counted in that
// tier's counters (the app's rates for it) instead of the limit's own.
//
// A JWT's claim is trusted only once the token is verified: its `alg` must be one the
// policy allows (HS256 with a secret; RS256 or ES256 with a JWKS), which refuses `none` and
// an HS256 token offered against a public key; the signature is checked with Web Crypto;
// `exp` is required, `exp` and `nbf` are checked with the policy's leeway; `iss` and `aud`
// when the policy names them. The JWKS is fetched with a time limit and a size limit,
// cached, and fetched again at most every JWKS_RETRY_MS when it fails or a token names an
// unknown `kid`, so made-up tokens cannot make the Worker hammer the issuer.

// Longest header, cookie or token value looked at; longer ones count as missing.
const MAX_KEY_VALUE_LENGTH = 8192;
// A hash secret shorter than this is treated as not set: it would not make guessing hard.
const MIN_KEY_SECRET_LENGTH = 16;
const JWKS_TIMEOUT_MS = 1500;
const JWKS_TTL_MS = 10 * 60 * 1000;
const JWKS_RETRY_MS = 30 * 1000;
const JWKS_MAX_BYTES = 64 * 1024;
const JWKS_MAX_KEYS = 32;
// At most this many keys of a JWKS are tried for a token without a kid.
const MAX_KEYS_TRIED = 4;
const BASE64URL = /^[A-Za-z0-9_-]+$/;
const BEARER = /^bearer[ \t]+/i;
const ENCODER = new TextEncoder();
const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true });

// Per isolate: the imported hash key, and each JWKS with its imported keys.
let hashKeyCache = null;
const jwksCache = new Map();
let warnedNoSecret = false;

/** The value of the first cookie of this name in a Cookie header, or null. */
function cookieValue(header, name) {
  if (typeof header !== "string" || header === "") {
    return null;
  }
  for (const pair of header.split(";")) {
    const eq = pair.indexOf("=");
    if (eq >= 0 && pair.slice(0, eq).trim() === name) {
      return pair.slice(eq + 1).trim();
    }
  }
  return null;
}

/**
 * The key's raw value in a request: a header (all its copies, as Headers.get joins them) or
 * a cookie; null when missing, empty or longer than MAX_KEY_VALUE_LENGTH.
 */
function rawKeyValue(headers, source) {
  const value =
    source.cookie != null ? cookieValue(headers.get("Cookie"), source.cookie) : headers.get(source.header);
  if (value === null) {
    return null;
  }
  const text = value.trim();
  return text === "" || text.length > MAX_KEY_VALUE_LENGTH ? null : text;
}

/** Bytes as unpadded base64url. */
function base64url(bytes) {
  let text = "";
  for (const byte of new Uint8Array(bytes)) {
    text += String.fromCharCode(byte);
  }
  return btoa(text).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** Unpadded base64url to bytes; null for anything else (padding, other alphabets). */
function fromBase64url(text) {
  if (!BASE64URL.test(text) || text.length % 4 === 1) {
    return null;
  }
  try {
    const binary = atob(text.replaceAll("-", "+").replaceAll("_", "/"));
    return Uint8Array.from(binary, (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
}

/** A JSON object from base64url text (strict UTF-8); null for anything else. */
function jsonObject(text) {
  const bytes = fromBase64url(text);
  if (bytes === null) {
    return null;
  }
  try {
    const value = JSON.parse(STRICT_UTF8.decode(bytes));
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : null;
  } catch {
    return null;
  }
}

/** The HMAC key for the hash secret, imported once per isolate (per secret value). */
async function hashKey(secret) {
  if (hashKeyCache === null || hashKeyCache.secret !== secret) {
    const key = await crypto.subtle.importKey(
      "raw",
      ENCODER.encode(secret),
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign"],
    );
    hashKeyCache = { secret, key };
  }
  return hashKeyCache.key;
}

/**
 * The binding key for a value: "k:" and HMAC-SHA-256(secret, kind, name, value), 45
 * characters; null when the secret is not set (the caller counts by address instead).
 */
async function keyedHash(env, config, spec, value) {
  const secret = env[config.keySecret];
  if (typeof secret !== "string" || secret.length < MIN_KEY_SECRET_LENGTH) {
    if (!warnedNoSecret) {
      warnedNoSecret = true;
      console.error(
        `edgegen: the secret ${config.keySecret} is not set (or shorter than ` +
          `${MIN_KEY_SECRET_LENGTH} characters), so limits keyed by a header, cookie or token ` +
          `count by client IP; set it with: wrangler secret put ${config.keySecret}`,
      );
    }
    return null;
  }
  const name = spec.kind === "jwt" ? spec.claim : (spec.header ?? spec.cookie);
  const message = ENCODER.encode(`${spec.kind}\u0000${name}\u0000${value}`);
  const mac = await crypto.subtle.sign("HMAC", await hashKey(secret), message);
  return "k:" + base64url(mac);
}

// --- JSON Web Tokens -----------------------------------------------------------------------

/** A claim value as key text: a string or a finite number; null for anything else. */
function claimText(value) {
  if (typeof value === "string" && value !== "" && value.length <= MAX_KEY_VALUE_LENGTH) {
    return value;
  }
  return typeof value === "number" && Number.isFinite(value) ? String(value) : null;
}

/** exp (required), nbf, iss and aud against the policy, with its leeway, in seconds. */
function claimsValid(payload, spec, nowSeconds) {
  const leeway = spec.leeway;
  if (typeof payload.exp !== "number" || !Number.isFinite(payload.exp)) {
    return false;
  }
  if (nowSeconds >= payload.exp + leeway) {
    return false;
  }
  if (payload.nbf !== undefined) {
    if (typeof payload.nbf !== "number" || !Number.isFinite(payload.nbf)) {
      return false;
    }
    if (nowSeconds < payload.nbf - leeway) {
      return false;
    }
  }
  if (spec.issuer != null && payload.iss !== spec.issuer) {
    return false;
  }
  if (spec.audience != null) {
    const aud = payload.aud;
    const held = Array.isArray(aud) ? aud.includes(spec.audience) : aud === spec.audience;
    if (!held) {
      return false;
    }
  }
  return true;
}

async function verifyHs256(secret, signature, data) {
  if (typeof secret !== "string" || secret === "" || signature.length !== 32) {
    return false;
  }
  const key = await crypto.subtle.importKey(
    "raw",
    ENCODER.encode(secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["verify"],
  );
  return crypto.subtle.verify("HMAC", key, signature, data);
}

/** Whether a JWK can check an `alg` signature: its type, curve, use and own alg agree. */
function jwkFits(jwk, alg) {
  if (jwk === null || typeof jwk !== "object") {
    return false;
  }
  if ((jwk.use !== undefined && jwk.use !== "sig") || (jwk.alg !== undefined && jwk.alg !== alg)) {
    return false;
  }
  if (alg === "RS256") {
    return jwk.kty === "RSA" && typeof jwk.n === "string" && typeof jwk.e === "string";
  }
  return jwk.kty === "EC" && jwk.crv === "P-256" && typeof jwk.x === "string" && typeof jwk.y === "string";
}

/** Import a JWK for verifying (only the public members are passed on). */
function importJwk(jwk, alg) {
  if (alg === "RS256") {
    return crypto.subtle.importKey(
      "jwk",
      { kty: "RSA", n: jwk.n, e: jwk.e, ext: true },
      { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" },
      false,
      ["verify"],
    );
  }
  return crypto.subtle.importKey(
    "jwk",
    { kty: "EC", crv: "P-256", x: jwk.x, y: jwk.y, ext: true },
    { name: "ECDSA", namedCurve: "P-256" },
    false,
    ["verify"],
  );
}

/** Fetch a JWKS within JWKS_TIMEOUT_MS and JWKS_MAX_BYTES; its keys, or an exception. */
async function fetchJwks(url) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error("JWKS fetch timed out")), JWKS_TIMEOUT_MS);
  });
  const load = (async () => {
    const response = await fetch(url, { headers: { Accept: "application/json" }, redirect: "manual" });
    if (response.status !== 200) {
      throw new Error(`JWKS answered ${response.status}`);
    }
    const text = await response.text();
    if (text.length > JWKS_MAX_BYTES) {
      throw new Error("JWKS too large");
    }
    const doc = JSON.parse(text);
    if (doc === null || typeof doc !== "object" || !Array.isArray(doc.keys)) {
      throw new Error("JWKS has no keys");
    }
    return doc.keys.slice(0, JWKS_MAX_KEYS);
  })();
  try {
    return await Promise.race([load, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The JWKS entry for a URL: cached for JWKS_TTL_MS; fetched again sooner (`refresh`, for an
 * unknown kid) or after a failure no more than once per JWKS_RETRY_MS. A failed fetch keeps
 * the keys held before; with none, tokens stay unverified until a fetch succeeds.
 */
async function jwksEntry(url, refresh) {
  let entry = jwksCache.get(url);
  if (entry === undefined) {
    entry = { keys: [], imported: new Map(), expires: 0, retryAt: 0, pending: null };
    jwksCache.set(url, entry);
  }
  const now = Date.now();
  const due = now >= entry.expires || (refresh && now >= entry.retryAt);
  if (entry.pending === null && due && now >= entry.retryAt) {
    entry.pending = fetchJwks(url)
      .then(
        (keys) => {
          entry.keys = keys;
          entry.imported = new Map();
          entry.expires = Date.now() + JWKS_TTL_MS;
        },
        () => {},
      )
      .finally(() => {
        entry.retryAt = Date.now() + JWKS_RETRY_MS;
        entry.pending = null;
      });
  }
  if (entry.pending !== null) {
    // The fetch may belong to another request, whose end would cancel it: wait no longer
    // than a fetch may take, on a timer of this request's own.
    let timer;
    const waited = new Promise((resolve) => {
      timer = setTimeout(resolve, JWKS_TIMEOUT_MS);
    });
    try {
      await Promise.race([entry.pending, waited]);
    } finally {
      clearTimeout(timer);
    }
  }
  return entry;
}

/** The keys of an entry that may have signed a token: by kid when it names one. */
function candidateKeys(entry, header, alg) {
  const fitting = entry.keys
    .map((jwk, index) => ({ jwk, index }))
    .filter(({ jwk }) => jwkFits(jwk, alg));
  if (typeof header.kid === "string") {
    return fitting.filter(({ jwk }) => jwk.kid === header.kid);
  }
  return header.kid === undefined ? fitting.slice(0, MAX_KEYS_TRIED) : [];
}

async function verifyWithJwks(url, header, alg, signature, data) {
  if (alg === "ES256" && signature.length !== 64) {
    return false;
  }
  let entry = await jwksEntry(url, false);
  let candidates = candidateKeys(entry, header, alg);
  if (candidates.length === 0 && typeof header.kid === "string") {
    // The issuer may have rotated its keys since the cached copy.
    entry = await jwksEntry(url, true);
    candidates = candidateKeys(entry, header, alg);
  }
  for (const { jwk, index } of candidates) {
    const cacheKey = `${alg}:${index}`;
    if (!entry.imported.has(cacheKey)) {
      entry.imported.set(cacheKey, importJwk(jwk, alg).catch(() => null));
    }
    const key = await entry.imported.get(cacheKey);
    if (key === null) {
      continue;
    }
    const name = alg === "RS256" ? "RSASSA-PKCS1-v1_5" : { name: "ECDSA", hash: "SHA-256" };
    if (await crypto.subtle.verify(name, key, signature, data)) {
      return true;
    }
  }
  return false;
}

/** The payload of a token that verifies under the key's rules, or null. */
async function verifiedPayload(token, spec, env) {
  const parts = token.split(".");
  if (parts.length !== 3) {
    return null;
  }
  const header = jsonObject(parts[0]);
  const payload = jsonObject(parts[1]);
  const signature = fromBase64url(parts[2]);
  if (header === null || payload === null || signature === null) {
    return null;
  }
  // Only the algorithms the policy allows: never "none", never HS256 against a public key.
  if (typeof header.alg !== "string" || !spec.algorithms.includes(header.alg)) {
    return null;
  }
  // No critical extension is understood here (RFC 7515 4.1.11).
  if (header.crit !== undefined) {
    return null;
  }
  const data = ENCODER.encode(`${parts[0]}.${parts[1]}`);
  const valid =
    header.alg === "HS256"
      ? await verifyHs256(env[spec.secret], signature, data)
      : await verifyWithJwks(spec.jwks, header, header.alg, signature, data);
  if (!valid || !claimsValid(payload, spec, Date.now() / 1000)) {
    return null;
  }
  return payload;
}

/**
 * The verified claims a JWT key counts by, {value, tier} (tier: the claim the policy names
 * for `edge.tiers`, or null), or null when there is no token or it does not verify.
 */
async function jwtClaims(headers, spec, env) {
  let token = rawKeyValue(headers, spec);
  if (token === null) {
    return null;
  }
  if (spec.header != null) {
    token = token.replace(BEARER, "");
  }
  const payload = await verifiedPayload(token, spec, env);
  if (payload === null) {
    return null;
  }
  const value = claimText(payload[spec.claim]);
  const tier = spec.tierClaim != null ? payload[spec.tierClaim] : undefined;
  return value === null ? null : { value, tier: typeof tier === "string" ? tier : null };
}

/**
 * What a request is counted under for a key: {key, tier}, the keyed hash of the value and
 * the verified tier (or null); null when the request has no usable value (missing,
 * unverified) or the hash secret is unset. Never throws.
 */
async function keyedIdentity(request, env, config, spec) {
  try {
    const found =
      spec.kind === "jwt"
        ? await jwtClaims(request.headers, spec, env)
        : { value: rawKeyValue(request.headers, spec), tier: null };
    if (found === null || found.value === null) {
      return null;
    }
    const key = await keyedHash(env, config, spec, found.value);
    return key === null ? null : { key, tier: found.tier };
  } catch {
    return null;
  }
}

/**
 * The [counter, key] pairs a limit with a `key` counts a request in: its own counter under
 * the keyed hash, or, for a verified caller in a tier the limit holds at the edge
 * (`edge.tiers`), that tier's counters instead; its own counter under `addressKey` when the
 * request has no usable key. `memo` holds this request's answers, by key spec, so each key
 * is read, verified and hashed once.
 */
async function keyedCounters(request, env, config, counter, addressKey, memo) {
  const id = JSON.stringify(counter.key);
  if (!memo.has(id)) {
    memo.set(id, keyedIdentity(request, env, config, counter.key));
  }
  const identity = await memo.get(id);
  if (identity === null) {
    return [[counter, addressKey]];
  }
  const tiers = counter.tiers ?? {};
  if (identity.tier !== null && Object.hasOwn(tiers, identity.tier)) {
    return tiers[identity.tier].map((tierCounter) => [tierCounter, identity.key]);
  }
  return [[counter, identity.key]];
}
