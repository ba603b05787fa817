{{- define "kvgate.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: kvgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "kvgate.redisSelectorLabels" -}}
app.kubernetes.io/name: kvgate-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.labels" -}}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/part-of: kvgate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvgate.gatewayName" -}}
{{- .Values.gateway.name | default (include "kvgate.name" .) -}}
{{- end -}}

{{- define "kvgate.redisURL" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "kvgate.name" .) -}}
{{- end -}}
{{- end -}}

{{/* The lowest Gateway listener port: kvgate serves it on containerPort. */}}
{{- define "kvgate.lowestPort" -}}
{{- $lowest := 0 -}}
{{- range .Values.gateway.listeners -}}
{{- if or (eq $lowest 0) (lt (int .port) $lowest) -}}
{{- $lowest = int .port -}}
{{- end -}}
{{- end -}}
{{- if eq $lowest 0 -}}
{{- fail "gateway.listeners: name at least one listener (the Service exposes its port)" -}}
{{- end -}}
{{- $lowest -}}
{{- end -}}
