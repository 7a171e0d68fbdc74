"""Planning: the composed configuration -> a validated JobPlan, before anything is written or submitted."""
