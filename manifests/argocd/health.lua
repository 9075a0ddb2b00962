-- Argo CD health check for serving.evolving-infra.io/AgentServingCluster.
-- Install as resource.customizations.health.serving.evolving-infra.io_AgentServingCluster in argocd-cm.
--
-- Healthy:     the operator has observed the current spec generation and Ready is True. A routine
--              re-split keeps Ready True (Adapting is True meanwhile), so the application does not flap;
--              a Degraded condition beside a True Ready (e.g. one node unreachable) shows in the message.
-- Degraded:    Invalid is True (the spec cannot be applied); or Ready is False while Degraded is True; or
--              Ready is False and Progressing is False with reason ProgressDeadlineExceeded: the cluster did
--              not become Ready within the operator's deadline (EVOLVING_OPERATOR_PROGRESS_DEADLINE_SECONDS,
--              600 s by default, counted from the start of the rollout). The operator judges the deadline
--              because this script has no clock.
-- Progressing: anything else: no status yet, a spec generation not yet observed, Ready not yet True.
local hs = {}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil then
    return c.reason
  end
  return fallback
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local status = obj.status
local conditions = status.conditions
local generation = obj.metadata and obj.metadata.generation

local invalid = condition(conditions, "Invalid")
if invalid ~= nil and invalid.status == "True" then
  hs.status = "Degraded"
  hs.message = "Invalid spec: " .. describe(invalid, "the spec cannot be applied")
  return hs
end

if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to apply spec generation " .. tostring(generation)
  return hs
end

local ready = condition(conditions, "Ready")
local degraded = condition(conditions, "Degraded")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  local split = status.split or "?"
  local adapting = condition(conditions, "Adapting")
  if adapting ~= nil and adapting.status == "True" and status.targetSplit ~= nil and status.targetSplit.split ~= nil then
    hs.message = "Serving at " .. split .. ", re-splitting to " .. status.targetSplit.split
  else
    hs.message = "Serving at " .. split
  end
  if degraded ~= nil and degraded.status == "True" then
    hs.message = hs.message .. " (degraded: " .. describe(degraded, "Degraded") .. ")"
  end
  return hs
end

local progressing = condition(conditions, "Progressing")
if progressing ~= nil and progressing.status == "False" and progressing.reason == "ProgressDeadlineExceeded" then
  hs.status = "Degraded"
  hs.message = describe(progressing, "Not ready within the progress deadline")
  return hs
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the cluster to become ready")
return hs
