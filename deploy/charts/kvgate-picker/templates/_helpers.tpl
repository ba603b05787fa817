{{/* The picker's name: <release>-epp, as the Inference Extension's chart names it. */}}
{{- define "kvgate-picker.name" -}}
{{- printf "%s-epp" (.Release.Name | trunc 59 | trimSuffix "-") -}}
{{- end -}}

{{- define "kvgate-picker.labels" -}}
{{ include "kvgate-picker.selectorLabels" . }}
app.kubernetes.io/part-of: kvgate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvgate-picker.selectorLabels" -}}
app.kubernetes.io/name: kvgate-picker
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "kvgate-picker.redisSelectorLabels" -}}
app.kubernetes.io/name: kvgate-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate-picker.image" -}}
{{- $image := .Values.inferenceExtension.image -}}
{{- if $image.hub -}}
{{- printf "%s/%s:%s" $image.hub $image.name $image.tag -}}
{{- else -}}
{{- printf "%s:%s" $image.name $image.tag -}}
{{- end -}}
{{- end -}}

{{/* kvgate's engine name for inferencePool.modelServerType. */}}
{{- define "kvgate-picker.engine" -}}
{{- $type := .Values.inferencePool.modelServerType | default "vllm" -}}
{{- $known := dict "vllm" "vllm" "sglang" "sglang" "trtllm" "trtllm" "triton" "triton" "triton-tensorrt-llm" "triton" -}}
{{- if not (hasKey $known $type) -}}
{{- fail (printf "inferencePool.modelServerType %q: use one of vllm, sglang, trtllm, triton, triton-tensorrt-llm" $type) -}}
{{- end -}}
{{- get $known $type -}}
{{- end -}}

{{- define "kvgate-picker.redisURL" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "kvgate-picker.name" .) -}}
{{- end -}}
{{- end -}}

{{/* The EndpointPickerConfig file the picker loads (--config-file), or "": one of pluginsCustomConfig. */}}
{{- define "kvgate-picker.pluginsConfig" -}}
{{- $ext := .Values.inferenceExtension -}}
{{- if and $ext.pluginsConfigFile (hasKey ($ext.pluginsCustomConfig | default dict) $ext.pluginsConfigFile) -}}
{{ $ext.pluginsConfigFile }}
{{- end -}}
{{- end }}
