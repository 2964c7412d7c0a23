{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "petstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full resource name: the release name when it already contains the chart name. */}}
{{- define "petstore.fullname" -}}
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

{{- define "petstore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name and instance: shared by every object of the release. */}}
{{- define "petstore.instanceLabels" -}}
app.kubernetes.io/name: {{ include "petstore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selects the API pods only: never the migration or test pods. */}}
{{- define "petstore.selectorLabels" -}}
{{ include "petstore.instanceLabels" . }}
app.kubernetes.io/component: api
{{- end }}

{{- define "petstore.labels" -}}
helm.sh/chart: {{ include "petstore.chart" . }}
{{ include "petstore.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: petstore
{{- end }}

{{- define "petstore.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "petstore.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "petstore.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Name of the Secret the chart makes for credentials supplied in values. */}}
{{- define "petstore.secretName" -}}
{{- printf "%s-credentials" (include "petstore.fullname" .) }}
{{- end }}

{{- define "petstore.redisSecretName" -}}
{{- default (include "petstore.secretName" .) .Values.redis.existingSecret }}
{{- end }}

{{- define "petstore.postgresSecretName" -}}
{{- default (include "petstore.secretName" .) .Values.postgres.existingSecret }}
{{- end }}

{{- define "petstore.plansConfigMapName" -}}
{{- printf "%s-plans" (include "petstore.fullname" .) }}
{{- end }}

{{- define "petstore.keysSecretName" -}}
{{- default (printf "%s-keys" (include "petstore.fullname" .)) .Values.apiKeys.existingSecret }}
{{- end }}

{{/* Whether the rate-limit helm test (and its plan and key) is on. */}}
{{- define "petstore.rateLimitTest" -}}
{{- if and .Values.tests.enabled .Values.tests.rateLimit.apiKey }}true{{ end }}
{{- end }}

{{/* Whether the pods read a static keys file. */}}
{{- define "petstore.keysFile" -}}
{{- if or .Values.apiKeys.existingSecret .Values.apiKeys.entries (include "petstore.rateLimitTest" .) }}true{{ end }}
{{- end }}

{{/* Whether the chart makes the keys Secret itself. */}}
{{- define "petstore.keysSecret" -}}
{{- if and (not .Values.apiKeys.existingSecret) (or .Values.apiKeys.entries (include "petstore.rateLimitTest" .)) }}true{{ end }}
{{- end }}

{{/* Whether more than one pod can run, so a disruption budget means something. */}}
{{- define "petstore.multiReplica" -}}
{{- if or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The preStop sleep action needs Kubernetes 1.30 (on by default from then). */}}
{{- define "petstore.preStopSleep" -}}
{{- if and (gt (int .Values.lifecycle.preStopSleepSeconds) 0) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* How a pod reaches Redis (redis.enabled): the service's and the finalize Job's. */}}
{{- define "petstore.redisEnv" -}}
- name: PETSTORE_REDIS_MODE
  value: {{ .Values.redis.mode | quote }}
{{- if eq .Values.redis.mode "single" }}
- name: PETSTORE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "petstore.redisSecretName" . }}
      key: {{ .Values.redis.urlKey }}
{{- else }}
- name: PETSTORE_REDIS_ADDRS
  value: {{ join "," .Values.redis.addrs | quote }}
{{- end }}
{{- if eq .Values.redis.mode "sentinel" }}
- name: PETSTORE_REDIS_MASTER_NAME
  value: {{ .Values.redis.masterName | quote }}
{{- end }}
{{- with .Values.redis.username }}
- name: PETSTORE_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if or .Values.redis.existingSecret .Values.redis.password }}
- name: PETSTORE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "petstore.redisSecretName" . }}
      key: {{ .Values.redis.passwordKey }}
      # The password may also sit in the URL, so the key is optional.
      optional: true
{{- end }}
- name: PETSTORE_REDIS_TIMEOUT
  value: {{ .Values.redis.timeout | quote }}
{{- end }}

{{- define "petstore.rateLimitReplicas" -}}
{{- if gt (int .Values.rateLimit.replicas) 0 }}
{{- .Values.rateLimit.replicas }}
{{- else if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.minReplicas }}
{{- else }}
{{- .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
Hardening shared by every pod of the chart (service, migration job, tests).
Not configurable on purpose: the image runs as 65532 and needs nothing more.
*/}}
{{- define "petstore.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "petstore.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The database URL, from the chart-made or an existing Secret. */}}
{{- define "petstore.databaseEnv" -}}
- name: PETSTORE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "petstore.postgresSecretName" . }}
      key: {{ .Values.postgres.urlKey }}
{{- end }}

{{/* Fails the render on values that cannot work together. */}}
{{- define "petstore.validate" -}}
{{- if and (eq .Values.store "memory") (include "petstore.multiReplica" .) }}
{{- fail "store=memory keeps pets in each pod: with more than one replica (or autoscaling) set store=postgres" }}
{{- end }}
{{- if and (eq .Values.store "postgres") (not .Values.postgres.existingSecret) (not .Values.postgres.url) }}
{{- fail "store=postgres needs postgres.existingSecret or postgres.url" }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- if and (eq .Values.redis.mode "single") (not .Values.redis.existingSecret) (not .Values.redis.url) }}
{{- fail "redis.mode=single needs redis.existingSecret or redis.url" }}
{{- end }}
{{- if and (ne .Values.redis.mode "single") (not .Values.redis.addrs) }}
{{- fail (printf "redis.mode=%s needs redis.addrs" .Values.redis.mode) }}
{{- end }}
{{- if and (eq .Values.redis.mode "sentinel") (not .Values.redis.masterName) }}
{{- fail "redis.mode=sentinel needs redis.masterName" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- $prestop := 0 }}
{{- if include "petstore.preStopSleep" . }}{{ $prestop = int .Values.lifecycle.preStopSleepSeconds }}{{ end }}
{{- $total := add $prestop .Values.lifecycle.drainDelaySeconds .Values.lifecycle.shutdownGraceSeconds }}
{{- if gt (int $total) (int .Values.terminationGracePeriodSeconds) }}
{{- fail (printf "preStop sleep (%d) + drain delay (%d) + shutdown grace (%d) = %ds exceeds terminationGracePeriodSeconds (%d)" $prestop (int .Values.lifecycle.drainDelaySeconds) (int .Values.lifecycle.shutdownGraceSeconds) (int $total) (int .Values.terminationGracePeriodSeconds)) }}
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.redis.enabled (not .Values.networkPolicy.redisEgress.to) }}
{{- fail "networkPolicy.enabled with redis.enabled needs networkPolicy.redisEgress.to (where Redis lives)" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (eq .Values.store "postgres") (not .Values.networkPolicy.postgresEgress.to) }}
{{- fail "networkPolicy.enabled with store=postgres needs networkPolicy.postgresEgress.to (where PostgreSQL lives)" }}
{{- end }}
{{- if and .Values.tests.rateLimit.apiKey (hasKey .Values.plans .Values.tests.rateLimit.plan) }}
{{- fail (printf "plans.%s is reserved for the rate-limit helm test; choose another tests.rateLimit.plan" .Values.tests.rateLimit.plan) }}
{{- end }}
{{- end }}

{{/* Egress rules of the network policies: DNS, Redis, PostgreSQL. */}}
{{- define "petstore.dnsEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.dns.to | nindent 4 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}

{{- define "petstore.redisEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.redisEgress.to | nindent 4 }}
  ports:
    {{- range .Values.networkPolicy.redisEgress.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}

{{- define "petstore.postgresEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.postgresEgress.to | nindent 4 }}
  ports:
    {{- range .Values.networkPolicy.postgresEgress.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
