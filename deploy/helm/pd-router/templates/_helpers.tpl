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

{{/* State backend the router will run with: redis when redis.url is set, else config.state.backend. */}}
{{- define "pd-router.stateBackend" -}}
{{- if .Values.redis.url }}redis
{{- else }}{{ dig "state" "backend" "memory" (.Values.config | default dict) }}
{{- end }}
{{- end }}

{{/* config.yaml: the `config` value, with state.backend forced to redis when redis.url is set. */}}
{{- define "pd-router.configYaml" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- if .Values.redis.url }}
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

{{/* Refuse value combinations that deploy but cannot work. */}}
{{- define "pd-router.validate" -}}
{{- $backend := include "pd-router.stateBackend" . }}
{{- if not (has $backend (list "memory" "redis")) }}
{{- fail (printf "pd-router: config.state.backend must be memory or redis, got %q" $backend) }}
{{- end }}
{{- $replicas := int .Values.replicaCount }}
{{- if .Values.autoscaling.enabled }}{{ $replicas = int .Values.autoscaling.maxReplicas }}{{ end }}
{{- if and (gt $replicas 1) (eq $backend "memory") (not .Values.allowMemoryStateWithReplicas) }}
{{- fail (printf "pd-router: %d replicas with state.backend=memory would not share routing state; set redis.url (or config.state.backend=redis), or set allowMemoryStateWithReplicas=true to accept independent replicas" $replicas) }}
{{- end }}
{{- if eq $backend "redis" }}
{{- $hasUrl := or .Values.redis.url (dig "state" "redis_url" "" (.Values.config | default dict)) }}
{{- range .Values.extraEnv }}{{ if eq .name "PD_ROUTER_STATE__REDIS_URL" }}{{ $hasUrl = true }}{{ end }}{{ end }}
{{- if not $hasUrl }}
{{- fail "pd-router: state.backend=redis needs a Redis URL: set redis.url, config.state.redis_url, or PD_ROUTER_STATE__REDIS_URL in extraEnv" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Container environment: admin token from a Secret, Redis URL, then extraEnv. */}}
{{- define "pd-router.env" -}}
{{- $secretName := include "pd-router.adminSecretName" . }}
{{- if $secretName }}
- name: PD_ROUTER_SERVER__ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secretName }}
      key: {{ .Values.existingSecretKey }}
{{- end }}
{{- if .Values.redis.url }}
- name: PD_ROUTER_STATE__REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
