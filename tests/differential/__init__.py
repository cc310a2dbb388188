"""The differential suite's support package: one policy, one corpus, every layer.

- :mod:`.spec`: the test policy and the routes of the two apps, with the limits that claim
  each route (the ground truth a layer is held to);
- :mod:`.corpus`: the request spellings, drawn by Hypothesis from the policy's matchers;
- :mod:`.rawhttp`: a raw-socket HTTP/1.1 client that sends a request target byte for byte;
- :mod:`.apps`: the FastAPI and Flask apps and the servers (uvicorn, waitress) they run in;
- :mod:`.runners`: the corpus through the apps and through the Worker in workerd
  (``worker_runner.mjs`` drives Miniflare), as records;
- :mod:`.report`: mismatches as a compact table.

tests/test_differential.py holds the invariants.
"""
