// Sample Worker for the harness self-test: one ratelimit binding keyed by the client IP.
// Requests over the limit get 429; the rest go to the origin unchanged.
export default {
  async fetch(request, env, ctx) {
    const ip = request.headers.get("cf-connecting-ip");
    if (ip === null) {
      // No client IP: let the request through, marked so the test can see the branch.
      const response = await fetch(request);
      const marked = new Response(response.body, response);
      marked.headers.set("x-sample-ip", "none");
      return marked;
    }
    const { success } = await env.RL_SAMPLE.limit({ key: ip });
    if (!success) {
      return new Response("rate limited\n", {
        status: 429,
        headers: { "retry-after": "60", "content-type": "text/plain" },
      });
    }
    return fetch(request);
  },
};
