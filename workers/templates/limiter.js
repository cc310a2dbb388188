// The logic of edgegen's rate-limit Worker, included verbatim by worker.js.j2.
//
// Everything that comes from the policy arrives as one JSON object (CONFIG in the generated
// module, `config` here); this file holds no policy data. It defines plain functions and no
// exports, so tests can run it in workerd with a different entry point.
//
// For each request: find the limits whose matcher applies (same meaning as policy/_match.py:
// exact paths OR path prefixes, AND methods, AND hosts), drop unauthenticated-only limits
// when the request carries a credential, count the client IP (CF-Connecting-IP) in each
// limit's binding in policy order, and answer 429 for the first limit that refuses.
// Anything else, including every internal error, passes the request to the origin untouched:
// a broken limiter must not take the site down.

// Longest client key sent to a binding. An IPv6 address is at most 45 characters; anything
// longer is not an address Cloudflare set, and is cut rather than trusted to be small.
const MAX_KEY_LENGTH = 64;

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

/** Whether a limit's matcher applies; `path` is `new URL(request.url).pathname`. */
function limitMatches(limit, method, path, host) {
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
  return limit.paths.includes(path) || limit.pathPrefixes.some((p) => path.startsWith(p));
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

/** The limits that apply to a request, in policy order. */
function applicableLimits(request, url, config) {
  const method = request.method;
  const path = url.pathname;
  const host = url.host;
  let authenticated = null;
  return config.limits.filter((limit) => {
    if (!limitMatches(limit, method, path, host)) {
      return false;
    }
    if (limit.unauthenticatedOnly) {
      if (authenticated === null) {
        authenticated = isAuthenticated(request.headers, config.authenticatedWhen);
      }
      return !authenticated;
    }
    return true;
  });
}

/**
 * The key a binding counts: the client IP Cloudflare puts in CF-Connecting-IP.
 *
 * Null when the header is missing or empty. Cloudflare always sets it on requests from the
 * internet (and clients cannot forge it there), so a request without it did not come
 * through the edge (a local test, a subrequest); such requests are not counted, as one
 * shared "unknown" bucket would let a single caller lock everyone else out.
 */
function clientKey(headers) {
  const value = headers.get("CF-Connecting-IP");
  if (value === null) {
    return null;
  }
  const key = value.trim();
  if (key === "") {
    return null;
  }
  return key.length > MAX_KEY_LENGTH ? key.slice(0, MAX_KEY_LENGTH) : key;
}

/** The 429 answer: RFC 9457 problem details, Retry-After and RateLimit-Policy. */
function tooManyRequests(limit) {
  return new Response(JSON.stringify(limit.problem), {
    status: 429,
    headers: {
      "Content-Type": "application/problem+json",
      // The binding does not say when its window resets; the period is the longest wait.
      "Retry-After": String(limit.period),
      "RateLimit-Policy": limit.policy,
      "Cache-Control": "no-store",
    },
  });
}

/** The 429 response for the first limit that refuses the request, or null to let it pass. */
async function decide(request, env, config) {
  const url = new URL(request.url);
  const limits = applicableLimits(request, url, config);
  if (limits.length === 0) {
    return null;
  }
  const key = clientKey(request.headers);
  if (key === null) {
    return null;
  }
  for (const limit of limits) {
    let outcome;
    try {
      outcome = await env[limit.binding].limit({ key });
    } catch {
      // A missing or failing binding disables that limit only, never the request.
      continue;
    }
    if (outcome !== null && typeof outcome === "object" && outcome.success === false) {
      return tooManyRequests(limit);
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
  let refusal = null;
  try {
    refusal = await decide(request, env, config);
  } catch {
    refusal = null;
  }
  return refusal ?? fetch(request);
}
