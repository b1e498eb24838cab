{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "pd-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless it already holds it. */}}
{{- define "pd-router.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pd-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pd-router.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pd-router.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pd-router.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pd-router.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pd-router.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Name of the in-chart Redis (StatefulSet, Service, pod label). */}}
{{- define "pd-router.redisName" -}}
{{- printf "%s-redis" (include "pd-router.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "pd-router.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-router.name" . | trunc 57 | trimSuffix "-" }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: state-store
{{- end }}

{{/* The Redis objects' labels: not the router's selector labels, so that neither its Service
nor a ServiceMonitor picks them up. */}}
{{- define "pd-router.redisLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "pd-router.redisSelectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Redis URL given to the router as PD_ROUTER_STATE__REDIS_URL ("" = none from the chart). With a
password Secret the URL names $(PDR_REDIS_PASSWORD), which the kubelet expands from the env var
defined before it: the password never appears in the pod spec or the ConfigMap. */}}
{{- define "pd-router.redisUrl" -}}
{{- $url := .Values.redis.url }}
{{- if .Values.redis.enabled }}{{ $url = printf "redis://%s:6379/0" (include "pd-router.redisName" .) }}{{ end }}
{{- if and $url .Values.redis.auth.existingSecret }}
{{- $u := urlParse $url }}
{{- printf "%s://%s:$(PDR_REDIS_PASSWORD)@%s%s" $u.scheme .Values.redis.auth.username $u.host $u.path }}
{{- with $u.query }}?{{ . }}{{ end }}
{{- else }}{{ $url }}
{{- end }}
{{- end }}

{{/* State backend the router will run with: redis when the chart passes a Redis URL, else config.state.backend. */}}
{{- define "pd-router.stateBackend" -}}
{{- if include "pd-router.redisUrl" . }}redis
{{- else }}{{ dig "state" "backend" "memory" (.Values.config | default dict) }}
{{- end }}
{{- end }}

{{/* "true" when the router watches pods through the Kubernetes API (config.discovery.kubernetes.enabled). */}}
{{- define "pd-router.kubernetesDiscovery" -}}
{{- if dig "discovery" "kubernetes" "enabled" false (.Values.config | default dict) }}true{{ end }}
{{- end }}

{{/* Namespace whose pods discovery watches: config.discovery.kubernetes.namespace, else the release's. */}}
{{- define "pd-router.discoveryNamespace" -}}
{{- dig "discovery" "kubernetes" "namespace" "" (.Values.config | default dict) | default .Release.Namespace }}
{{- end }}

{{/* config.yaml: the `config` value, with state.backend forced to redis when the chart passes a Redis URL. */}}
{{- define "pd-router.configYaml" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- if include "pd-router.redisUrl" . }}
{{- $state := deepCopy (get $cfg "state" | default dict) }}
{{- $_ := set $state "backend" "redis" }}
{{- $_ := set $cfg "state" $state }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Name of the Secret holding the admin token ("" when there is none). */}}
{{- define "pd-router.adminSecretName" -}}
{{- if .Values.existingSecret }}{{ .Values.existingSecret }}
{{- else if .Values.adminToken }}{{ include "pd-router.fullname" . }}
{{- end }}
{{- end }}

{{/* Refuse value combinations that deploy but cannot work (types and names: values.schema.json). */}}
{{- define "pd-router.validate" -}}
{{- $backend := include "pd-router.stateBackend" . }}
{{- $cfg := .Values.config | default dict }}
{{- if not (has $backend (list "memory" "redis")) }}
{{- fail (printf "pd-router: config.state.backend must be memory or redis, got %q" $backend) }}
{{- end }}
{{- $replicas := int .Values.replicaCount }}
{{- if .Values.autoscaling.enabled }}{{ $replicas = int .Values.autoscaling.maxReplicas }}{{ end }}
{{- if and (gt $replicas 1) (eq $backend "memory") (not .Values.allowMemoryStateWithReplicas) }}
{{- fail (printf "pd-router: %d replicas with state.backend=memory would not share routing state; set redis.url or redis.enabled (or config.state.backend=redis), or set allowMemoryStateWithReplicas=true to accept independent replicas" $replicas) }}
{{- end }}
{{- if and (gt (int .Values.workers) 1) (eq $backend "memory") }}
{{- fail (printf "pd-router: workers=%d needs state.backend=redis (set redis.url or redis.enabled): worker processes must share booked load and residency" (int .Values.workers)) }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.url }}
{{- fail "pd-router: set either redis.url (your Redis) or redis.enabled (the chart's), not both" }}
{{- end }}
{{- range $where, $url := dict "redis.url" .Values.redis.url "config.state.redis_url" (dig "state" "redis_url" "" $cfg) }}
{{- if and $url (contains ":" ((urlParse $url).userinfo | default "")) }}
{{- fail (printf "pd-router: %s carries a password; put it in a Secret and set redis.auth.existingSecret (and redis.url without it)" $where) }}
{{- end }}
{{- end }}
{{- if and .Values.redis.auth.existingSecret (not (or .Values.redis.url .Values.redis.enabled)) }}
{{- fail "pd-router: redis.auth.existingSecret needs redis.url or redis.enabled: the chart builds the URL that uses the password" }}
{{- end }}
{{- if eq $backend "redis" }}
{{- $hasUrl := or (include "pd-router.redisUrl" .) (dig "state" "redis_url" "" $cfg) }}
{{- range .Values.extraEnv }}{{ if eq .name "PD_ROUTER_STATE__REDIS_URL" }}{{ $hasUrl = true }}{{ end }}{{ end }}
{{- if not $hasUrl }}
{{- fail "pd-router: state.backend=redis needs a Redis URL: set redis.url, redis.enabled, config.state.redis_url, or PD_ROUTER_STATE__REDIS_URL in extraEnv" }}
{{- end }}
{{- end }}
{{- if ge (int .Values.preStopSleepSeconds) (int .Values.terminationGracePeriodSeconds) }}
{{- fail "pd-router: preStopSleepSeconds must be shorter than terminationGracePeriodSeconds, or nothing is left to drain" }}
{{- end }}
{{- end }}

{{/* Seconds in-flight requests get after SIGTERM: the grace period less the preStop sleep and a 5 s margin. */}}
{{- define "pd-router.shutdownTimeout" -}}
{{- max 1 (sub (sub (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds)) 5) }}
{{- end }}

{{/* Container environment: admin token from a Secret, Redis password and URL, then extraEnv. */}}
{{- define "pd-router.env" -}}
{{- $secretName := include "pd-router.adminSecretName" . }}
{{- if $secretName }}
- name: PD_ROUTER_SERVER__ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secretName }}
      key: {{ .Values.existingSecretKey }}
{{- end }}
{{- if .Values.redis.auth.existingSecret }}
- name: PDR_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.auth.existingSecret }}
      key: {{ .Values.redis.auth.existingSecretPasswordKey }}
{{- end }}
{{- with include "pd-router.redisUrl" . }}
- name: PD_ROUTER_STATE__REDIS_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
