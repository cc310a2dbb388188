"""A small Django project rate-limited by examples/policy.yaml through applimit.django."""
