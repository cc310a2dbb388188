"""A zone's plan and apply: the plan's values, merging them from the zone, saved-plan
checks, rejections traced to the policy, the writes, plan and state files, the plan as
text."""
