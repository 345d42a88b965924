"""Planning: where a run's stages go, whether they fit, and when the pool lets the run start. Pure functions
and cores over the membership view and the model's facts.

  planner     RunPlan / StagePlan / EdgePlan (§11): plan_run on a placement, validate_plan
  placement   which nodes and contiguous block ranges, and whether each stage fits its node's memory
  pool        the PoolReady gate (§9), judged on the nodes a run's placement uses
  dry_run     what SubmitRun would do now: the pool refusal, and the Plan RPC's answer
"""
