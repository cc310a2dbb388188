// The logic of edgegen's rate-limit Worker, included verbatim by worker.js.j2.
//
// Everything that comes from the policy arrives as one JSON object (CONFIG in the generated
// module, `config` here); this file holds no policy data. It defines plain functions and no
// exports, so tests can run it in workerd with a different entry point.
//
// For each request: refuse with 400 a path whose decoded form holds a control character (as
// the app's middlewares do). Then find the limits whose matcher applies (same meaning as
// policy/edgegen_policy/_match.py: exact paths OR path prefixes, AND methods, AND hosts, where the path is
// checked in every form `requestPaths` gives), pick each limit's counter (requests that carry
// a credential are counted apart, against the limit's looser credentialed rate), count the
// client (`ipBucket` of CF-Connecting-IP; for a limit with a `key`, a keyed hash of its
// header, cookie or verified JWT claim, see keys.js) in each counter's binding in policy
// order, and
// answer 429 for the first counter that refuses. Anything else, including every internal
// error, passes the request to the origin untouched: a broken limiter must not take the site
// down.
//
// `decodePath`, `canonicalPath`, `requestPaths` and `ipBucket` are ports of
// policy/edgegen_policy/_match.py and policy/edgegen_policy/_net.py: they give exactly the strings the Python functions
// give, which tests check on generated corpora.

// Longest client key sent to a binding. An IPv6 network is at most 43 characters; anything
// longer is not an address Cloudflare set, and is cut rather than trusted to be small.
const MAX_KEY_LENGTH = 64;
// policy/edgegen_policy/_match.py MAX_PATH_LENGTH: paths are looked at up to three times this length.
const MAX_PATH_LENGTH = 16384;
// IPv6 clients are counted per network of this many bits unless the policy says otherwise.
const DEFAULT_IPV6_PREFIX = 64;

// --- paths: policy/edgegen_policy/_match.py decode_path, canonical_path, request_paths ------------------

// Python's bytes.decode("utf-8", "replace"): invalid bytes become U+FFFD (the same maximal
// subparts as WHATWG's decoder), and a byte order mark is kept, not swallowed.
const UTF8 = new TextDecoder("utf-8", { ignoreBOM: true });
const HEX_PAIR = /^[0-9A-Fa-f]{2}$/;
const ASCII_RUN = /[\x00-\x7f]+/g;
const SLASH_RUN = /\/{2,}/g;
// A path with none of these needs no work: nothing to decode, merge, resolve or turn.
const PLAIN_ROUTE = /^(?:\/[^%\\/?#\x00-\x1f\x7f]+)*\/?$/;
// C0 controls and DEL (policy/edgegen_policy/_match.py _CONTROLS): no resource name holds them, and routers
// read them each their own way (a Starlette route's "$" matches before a final "\n").
const HAS_CONTROL = /[\x00-\x1f\x7f]/;

/** Percent-decode one run of ASCII characters to bytes; a "%" without two hex digits stays. */
function unquoteBytes(run) {
  const bytes = new Uint8Array(run.length);
  let length = 0;
  for (let index = 0; index < run.length; index++) {
    const code = run.charCodeAt(index);
    const pair = run.slice(index + 1, index + 3);
    if (code === 0x25 && HEX_PAIR.test(pair)) {
      bytes[length++] = parseInt(pair, 16);
      index += 2;
    } else {
      bytes[length++] = code;
    }
  }
  return bytes.subarray(0, length);
}

/**
 * The path of a request target as a router sees it: query dropped, escapes decoded.
 *
 * Like Python's urllib.parse.unquote: every "%XX" is decoded once, each run of ASCII
 * characters as UTF-8 on its own (invalid bytes become U+FFFD); "%2F" becomes "/" like any
 * other escape.
 */
function decodePath(target) {
  let cut = target.length;
  for (const separator of ["?", "#"]) {
    const found = target.indexOf(separator);
    if (found >= 0 && found < cut) {
      cut = found;
    }
  }
  const path = target.slice(0, cut);
  if (!path.includes("%")) {
    return path;
  }
  return path.replace(ASCII_RUN, (run) => (run.includes("%") ? UTF8.decode(unquoteBytes(run)) : run));
}

/**
 * A decoded path in canonical form: "\" as "/", runs of "/" merged, "." and ".." segments
 * resolved (RFC 3986 5.2.4); it starts with "/" and keeps a trailing slash.
 */
function canonicalPath(path) {
  let text = path.replaceAll("\\", "/").replace(SLASH_RUN, "/");
  if (!text.startsWith("/")) {
    text = "/" + text;
  }
  if (!text.includes("/.")) {
    return text;
  }
  const out = [];
  const segments = text.split("/").slice(1);
  const last = segments.length - 1;
  segments.forEach((segment, index) => {
    if (segment === ".") {
      if (index === last) {
        out.push("");
      }
      return;
    }
    if (segment === "..") {
      if (out.length > 0) {
        out.pop();
      }
      if (index === last) {
        out.push("");
      }
      return;
    }
    out.push(segment);
  });
  return "/" + out.join("/");
}

/**
 * Every form a request path is checked in: the path as given (here the pathname WHATWG's
 * parser made of request.url), its decoded form and the canonical form of that, and both
 * again without a final newline when the decoded form ends in one; no repeats.
 */
function requestPaths(path) {
  const text = path.slice(0, MAX_PATH_LENGTH * 3);
  if (text.startsWith("/") && !text.includes("/.") && PLAIN_ROUTE.test(text)) {
    return [text];
  }
  const decoded = decodePath(text);
  const found = [text, decoded, canonicalPath(decoded)];
  if (decoded.endsWith("\n")) {
    const routed = decoded.slice(0, -1);
    found.push(routed, canonicalPath(routed));
  }
  const forms = [];
  for (const form of found) {
    if (!forms.includes(form)) {
      forms.push(form);
    }
  }
  return forms;
}

/**
 * The 400 answer for a path whose decoded form holds a control character
 * (policy/edgegen_policy/_match.py has_control_character), or null. Checked before anything else, as the
 * app's middlewares check it: such a path names no resource, and routers disagree on it.
 */
function controlCharacterRefusal(url) {
  const decoded = decodePath(url.pathname.slice(0, MAX_PATH_LENGTH * 3));
  const found = decoded.match(HAS_CONTROL);
  if (found === null) {
    return null;
  }
  const code = found[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, "0");
  const problem = {
    type: "about:blank",
    title: "Bad Request",
    status: 400,
    detail: `The request path holds the control character U+${code}, which no resource is named with; remove it.`,
  };
  return new Response(JSON.stringify(problem), {
    status: 400,
    headers: { "Content-Type": "application/problem+json", "Cache-Control": "no-store" },
  });
}

/** An exact path without its one trailing slash ("/" stays "/"). */
function exactKey(path) {
  return path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
}

// --- client addresses: policy/edgegen_policy/_net.py ip_bucket --------------------------------------------

// Python's str.strip() removes what str.isspace() calls whitespace: this set, not JS trim's.
const PY_STRIP =
  /^[\t\n\v\f\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t\n\v\f\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g;
const OCTET = /^[0-9]{1,3}$/;
const HEXTET = /^[0-9A-Fa-f]{1,4}$/;

/** Four octets of a dotted IPv4 address, as strict as Python's ipaddress; null otherwise. */
function parseIPv4(text) {
  const parts = text.split(".");
  if (parts.length !== 4) {
    return null;
  }
  const octets = [];
  for (const part of parts) {
    // Leading zeros are refused, as glibc's inet_pton and Python do.
    if (!OCTET.test(part) || (part !== "0" && part[0] === "0")) {
      return null;
    }
    const value = Number(part);
    if (value > 255) {
      return null;
    }
    octets.push(value);
  }
  return octets;
}

/** Eight hextets of an IPv6 address (zone id dropped), as Python's ipaddress reads it. */
function parseIPv6(text) {
  let address = text;
  const percent = text.indexOf("%");
  if (percent >= 0) {
    const zone = text.slice(percent + 1);
    if (zone === "" || zone.includes("%")) {
      return null;
    }
    address = text.slice(0, percent);
  }
  if (address === "") {
    return null;
  }
  const parts = address.split(":");
  if (parts.length < 3) {
    return null;
  }
  if (parts[parts.length - 1].includes(".")) {
    const octets = parseIPv4(parts.pop());
    if (octets === null) {
      return null;
    }
    parts.push(((octets[0] << 8) | octets[1]).toString(16), ((octets[2] << 8) | octets[3]).toString(16));
  }
  if (parts.length > 9) {
    return null;
  }
  let skip = -1;
  for (let index = 1; index < parts.length - 1; index++) {
    if (parts[index] === "") {
      if (skip >= 0) {
        return null;
      }
      skip = index;
    }
  }
  let high = parts.length;
  let low = 0;
  let skipped = 0;
  if (skip >= 0) {
    high = skip;
    low = parts.length - skip - 1;
    if (parts[0] === "" && --high > 0) {
      return null;
    }
    if (parts[parts.length - 1] === "" && --low > 0) {
      return null;
    }
    skipped = 8 - (high + low);
    if (skipped < 1) {
      return null;
    }
  } else if (parts.length !== 8 || parts[0] === "" || parts[7] === "") {
    return null;
  }
  const hextets = [];
  const take = (part) => {
    if (!HEXTET.test(part)) {
      return false;
    }
    hextets.push(parseInt(part, 16));
    return true;
  };
  for (let index = 0; index < high; index++) {
    if (!take(parts[index])) {
      return null;
    }
  }
  for (let index = 0; index < skipped; index++) {
    hextets.push(0);
  }
  for (let index = parts.length - low; index < parts.length; index++) {
    if (!take(parts[index])) {
      return null;
    }
  }
  return hextets;
}

/** An IPv6 address as Python prints it: lower-case hex, the longest run of 2+ zeros as "::". */
function formatIPv6(hextets) {
  let bestStart = -1;
  let bestLength = 0;
  let start = -1;
  let length = 0;
  hextets.forEach((value, index) => {
    if (value === 0) {
      if (start < 0) {
        start = index;
      }
      length += 1;
      if (length > bestLength) {
        bestLength = length;
        bestStart = start;
      }
    } else {
      start = -1;
      length = 0;
    }
  });
  const words = hextets.map((value) => value.toString(16));
  if (bestLength < 2) {
    return words.join(":");
  }
  const head = words.slice(0, bestStart).join(":");
  const tail = words.slice(bestStart + bestLength).join(":");
  return `${head}::${tail}`;
}

/** Two hextets as a dotted IPv4 address. */
function dotted(high, low) {
  return [high >> 8, high & 0xff, low >> 8, low & 0xff].join(".");
}

/**
 * The IPv4 client an IPv6 address carries (policy/edgegen_policy/_net.py `embedded_ipv4`), or null:
 * IPv4-mapped ::ffff:a.b.c.d, IPv4-translated ::ffff:0:a.b.c.d, NAT64 64:ff9b::a.b.c.d,
 * IPv4-compatible ::a.b.c.d, 6to4 2002:AABB:CCDD::/48 and Teredo 2001:0::/32 (the client
 * inverted in the last 32 bits). Each counts as that IPv4 client, as in the app.
 */
function embeddedIPv4(h) {
  const zeros = (from, to) => h.slice(from, to).every((value) => value === 0);
  if (zeros(0, 5) && h[5] === 0xffff) {
    return dotted(h[6], h[7]);
  }
  if (zeros(0, 4) && h[4] === 0xffff && h[5] === 0) {
    return dotted(h[6], h[7]);
  }
  if (h[0] === 0x64 && h[1] === 0xff9b && zeros(2, 6)) {
    return dotted(h[6], h[7]);
  }
  if (zeros(0, 6) && h[6] !== 0) {
    return dotted(h[6], h[7]);
  }
  if (h[0] === 0x2002) {
    return dotted(h[1], h[2]);
  }
  if (h[0] === 0x2001 && h[1] === 0) {
    return dotted(h[6] ^ 0xffff, h[7] ^ 0xffff);
  }
  return null;
}

/**
 * The key a client address is counted under (policy/edgegen_policy/_net.py ip_bucket, to the character).
 *
 * IPv4 as is; an IPv6 address that carries an IPv4 client (`embeddedIPv4`) as that IPv4
 * address; other IPv6 addresses as
 * their network of `ipv6Prefix` bits ("2001:db8:0:1::/64"), or the bare address for 128.
 * Text that is not an address comes back unchanged: it is still one caller's key.
 */
function ipBucket(ip, ipv6Prefix) {
  let text = ip.replace(PY_STRIP, "");
  if (text.startsWith("[") && text.endsWith("]")) {
    text = text.slice(1, -1);
  }
  if (text.includes("/")) {
    return ip;
  }
  const octets = parseIPv4(text);
  if (octets !== null) {
    return octets.join(".");
  }
  const hextets = parseIPv6(text);
  if (hextets === null) {
    return ip;
  }
  const embedded = embeddedIPv4(hextets);
  if (embedded !== null) {
    return embedded;
  }
  if (ipv6Prefix >= 128) {
    return formatIPv6(hextets);
  }
  const masked = hextets.map((value, index) => {
    const bits = Math.min(16, Math.max(0, ipv6Prefix - 16 * index));
    return value & ((0xffff << (16 - bits)) & 0xffff);
  });
  return `${formatIPv6(masked)}/${ipv6Prefix}`;
}

// --- matching ----------------------------------------------------------------------------

/** Lower-case a Host value and strip its port and trailing dots (IPv6 brackets kept). */
function normalizeHost(raw) {
  if (typeof raw !== "string" || raw === "") {
    return "";
  }
  const host = raw.trim().toLowerCase();
  if (host.startsWith("[")) {
    const end = host.indexOf("]");
    return end >= 0 ? host.slice(0, end + 1) : host;
  }
  const parts = host.split(":");
  const name = parts.length === 2 ? parts[0] : host;
  return name.replace(/\.+$/, "");
}

/** A normalised host against a policy host: exact, or "*.example.com" for subdomains. */
function hostMatches(pattern, host) {
  if (pattern.startsWith("*.")) {
    const suffix = pattern.slice(1);
    return host.endsWith(suffix) && host.length > suffix.length;
  }
  return host === pattern;
}

/**
 * Whether a limit's matcher applies; `paths` are the forms of the path (`requestPaths`).
 * The limit's exact paths are stored without a trailing slash, so "/a/" matches "/a".
 */
function limitMatches(limit, method, paths, host) {
  if (limit.methods.length > 0 && !limit.methods.includes(method.toUpperCase())) {
    return false;
  }
  if (limit.hosts.length > 0) {
    const name = normalizeHost(host);
    if (!limit.hosts.some((pattern) => hostMatches(pattern, name))) {
      return false;
    }
  }
  if (limit.paths.length === 0 && limit.pathPrefixes.length === 0) {
    return true;
  }
  return paths.some(
    (path) =>
      limit.paths.includes(exactKey(path)) || limit.pathPrefixes.some((p) => path.startsWith(p)),
  );
}

/** The names of the cookies in a Cookie header ("a=1; b=2"); pairs without "=" are skipped. */
function cookieNames(header) {
  const names = new Set();
  if (typeof header !== "string" || header === "") {
    return names;
  }
  for (const pair of header.split(";")) {
    const eq = pair.indexOf("=");
    if (eq < 0) {
      continue;
    }
    const name = pair.slice(0, eq).trim();
    if (name !== "") {
      names.add(name);
    }
  }
  return names;
}

/** True when any listed header is present and non-empty, or any listed cookie is sent. */
function isAuthenticated(headers, when) {
  for (const name of when.headers) {
    const value = headers.get(name);
    if (value !== null && value !== "") {
      return true;
    }
  }
  if (when.cookies.length === 0) {
    return false;
  }
  const sent = cookieNames(headers.get("Cookie"));
  return when.cookies.some((name) => sent.has(name));
}

/**
 * The counters that apply to a request, in policy order: for each matching limit, the
 * limit itself, or, when it is unauthenticated-only and the request carries a listed
 * credential, its `withCredential` counter. Only the credential's presence can be checked
 * here (the edge has no keys to verify it), so a made-up credential is still counted, at
 * the looser credentialed rate, rather than let through unlimited.
 */
function applicableLimits(request, url, config) {
  const method = request.method;
  const paths = requestPaths(url.pathname);
  const host = url.host;
  let authenticated = null;
  const counters = [];
  for (const limit of config.limits) {
    if (!limitMatches(limit, method, paths, host)) {
      continue;
    }
    if (limit.unauthenticatedOnly) {
      if (authenticated === null) {
        authenticated = isAuthenticated(request.headers, config.authenticatedWhen);
      }
      if (authenticated) {
        if (limit.withCredential) {
          counters.push(limit.withCredential);
        }
        continue;
      }
    }
    counters.push(limit);
  }
  return counters;
}

/**
 * The key a binding counts: the client Cloudflare puts in CF-Connecting-IP, as `ipBucket`
 * groups it (an IPv6 client by its network).
 *
 * Null when the header is missing or empty. Cloudflare always sets it on requests from the
 * internet (and clients cannot forge it there), so a request without it did not come
 * through the edge (a local test, a subrequest); such requests are not counted, as one
 * shared "unknown" bucket would let a single caller lock everyone else out.
 */
function clientKey(headers, config) {
  const value = headers.get("CF-Connecting-IP");
  if (value === null) {
    return null;
  }
  const text = value.trim();
  if (text === "") {
    return null;
  }
  const prefix = Number.isInteger(config.ipv6Prefix) ? config.ipv6Prefix : DEFAULT_IPV6_PREFIX;
  const key = ipBucket(text, prefix);
  return key.length > MAX_KEY_LENGTH ? key.slice(0, MAX_KEY_LENGTH) : key;
}

/** The 429 answer: RFC 9457 problem details, Retry-After and RateLimit-Policy. */
function tooManyRequests(counter) {
  return new Response(JSON.stringify(counter.problem), {
    status: 429,
    headers: {
      "Content-Type": "application/problem+json",
      // The binding does not say when its window resets; the period is the longest wait.
      "Retry-After": String(counter.period),
      "RateLimit-Policy": counter.policy,
      "Cache-Control": "no-store",
    },
  });
}

// --- count_when: checked before forwarding, counted after the answer ----------------------
//
// A limit with `countWhen` (the policy's count_when: [[low, high], ...] statuses) counts only
// answers of those statuses. The binding has no peek: `limit()` counts and answers at once.
// So the Worker calls it only after the origin's answer, for a listed status, and when it
// answers `success: false` the caller is marked spent for one period from then: in this
// isolate (SPENT_KEYS) and in the Cache API of this Cloudflare location, which the
// location's other isolates read (the binding's counters are per location too). A spent
// caller is refused before the request is forwarded. The bound (docs/edge.md, count_when):
// per location and window, `limit` + 1 counted answers reach the origin, plus those already
// in flight when the mark is set or not yet visible to another isolate.

// Marks this isolate holds: "binding\u0000key" -> ms since the epoch until which it is spent.
const SPENT_KEYS = new Map();
// Past this many marks, the expired ones are dropped, then the oldest.
const MAX_SPENT_KEYS = 10000;
// The Cache API cache the marks are shared in, apart from the zone's default cache.
const SPENT_CACHE = "edgegen-spent";
const SPENT_UNTIL_HEADER = "Edgegen-Spent-Until";

/** Whether an answer's status is one a `countWhen` counter counts. */
function countsStatus(counter, status) {
  return counter.countWhen.some((range) => range[0] <= status && status <= range[1]);
}

/**
 * The Cache API key of a mark: on the request's own host name (the Cache API keeps entries
 * for the zone's names), without the port, which the client picks among Cloudflare's and
 * which would give the mark one more key per port; under a path no policy string reaches
 * unescaped.
 */
function spentCacheKey(url, counter, key) {
  const binding = encodeURIComponent(counter.binding);
  return `https://${url.hostname}/.well-known/edgegen-spent/${binding}/${encodeURIComponent(key)}`;
}

/** Remember a mark in this isolate, keeping the map bounded. */
function rememberSpent(id, until) {
  if (SPENT_KEYS.size >= MAX_SPENT_KEYS) {
    const now = Date.now();
    for (const [other, otherUntil] of SPENT_KEYS) {
      if (otherUntil <= now) {
        SPENT_KEYS.delete(other);
      }
    }
    for (const other of SPENT_KEYS.keys()) {
      if (SPENT_KEYS.size < MAX_SPENT_KEYS) {
        break;
      }
      SPENT_KEYS.delete(other);
    }
  }
  SPENT_KEYS.set(id, until);
}

/** Whether this caller is marked spent for the counter: this isolate's mark, else the cache. */
async function isSpent(counter, key, url) {
  const id = `${counter.binding}\u0000${key}`;
  const until = SPENT_KEYS.get(id);
  const now = Date.now();
  if (until !== undefined) {
    if (until > now) {
      return true;
    }
    SPENT_KEYS.delete(id);
  }
  let found;
  try {
    const cache = await caches.open(SPENT_CACHE);
    found = await cache.match(spentCacheKey(url, counter, key));
  } catch {
    // No Cache API here (workers.dev, a local test): this isolate's marks only.
    return false;
  }
  if (found === undefined) {
    return false;
  }
  const shared = Number(found.headers.get(SPENT_UNTIL_HEADER));
  if (!Number.isFinite(shared) || shared <= now) {
    return false;
  }
  rememberSpent(id, shared);
  return true;
}

/** Mark the caller spent for one period from now, here and in the location's cache. */
async function markSpent(counter, key, url) {
  const until = Date.now() + counter.period * 1000;
  rememberSpent(`${counter.binding}\u0000${key}`, until);
  try {
    const cache = await caches.open(SPENT_CACHE);
    const mark = new Response(null, {
      headers: {
        "Cache-Control": `max-age=${counter.period}`,
        [SPENT_UNTIL_HEADER]: String(until),
      },
    });
    await cache.put(spentCacheKey(url, counter, key), mark);
  } catch {
    // Without the Cache API the mark stays in this isolate.
  }
}

/**
 * Count an answer in the `countWhen` counters it concerns: for a listed status, one
 * `limit()` call; `success: false` marks the caller spent.
 */
async function countAnswer(pending, status, env) {
  for (const { counter, key, url } of pending) {
    if (!countsStatus(counter, status)) {
      continue;
    }
    let outcome;
    try {
      outcome = await env[counter.binding].limit({ key });
    } catch {
      continue;
    }
    if (outcome !== null && typeof outcome === "object" && outcome.success === false) {
      await markSpent(counter, key, url);
    }
  }
}

/**
 * The 429 response for the first counter that refuses the request, a 400 for a path with a
 * control character, or null to let it pass. Counters with `countWhen` are not counted here:
 * a spent caller is refused, otherwise the counter goes into `pending`, for `countAnswer`.
 */
async function decide(request, env, config, pending = []) {
  const url = new URL(request.url);
  const badPath = controlCharacterRefusal(url);
  if (badPath !== null) {
    return badPath;
  }
  const counters = applicableLimits(request, url, config);
  if (counters.length === 0) {
    return null;
  }
  const key = clientKey(request.headers, config);
  if (key === null) {
    return null;
  }
  // Answers of keyedCounters (keys.js, present when a limit counts by more than the
  // address) for this request: each key is read, verified and hashed once.
  const keyed = new Map();
  for (const counter of counters) {
    const pairs = counter.key ? await keyedCounters(request, env, config, counter, key, keyed) : [[counter, key]];
    for (const [applied, counted] of pairs) {
      if (applied.countWhen) {
        // Counted after the answer (countAnswer); now only whether the caller is spent.
        if (await isSpent(applied, counted, url)) {
          return tooManyRequests(applied);
        }
        pending.push({ counter: applied, key: counted, url });
        continue;
      }
      let outcome;
      try {
        outcome = await env[applied.binding].limit({ key: counted });
      } catch {
        // A missing or failing binding disables that counter only, never the request.
        continue;
      }
      if (outcome !== null && typeof outcome === "object" && outcome.success === false) {
        return tooManyRequests(applied);
      }
    }
  }
  return null;
}

/** The Worker's fetch handler: refuse over-limit requests, pass everything else on. */
async function handleRequest(request, env, ctx, config) {
  try {
    // Should anything below throw after all, Cloudflare sends the request to the origin.
    ctx.passThroughOnException();
  } catch {
    // Not every runtime offers it (local tests); the try/catch below covers those.
  }
  const pending = [];
  let refusal = null;
  try {
    refusal = await decide(request, env, config, pending);
  } catch {
    refusal = null;
  }
  if (refusal !== null) {
    return refusal;
  }
  if (pending.length === 0) {
    return fetch(request);
  }
  const response = await fetch(request);
  try {
    await countAnswer(pending, response.status, env);
  } catch {
    // Counting failed: the answer still goes back to the client.
  }
  return response;
}
