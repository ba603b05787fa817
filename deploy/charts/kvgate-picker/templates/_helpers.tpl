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

{{/* The standalone mode (no InferencePool): "true" or "". */}}
{{- define "kvgate-picker.standalone" -}}
{{- if not .Values.inferenceExtension.endpointsServer.createInferencePool -}}true{{- end -}}
{{- end -}}

{{/* Envoy in the picker's Pod: "true" or "" (always in the standalone mode). */}}
{{- define "kvgate-picker.sidecar" -}}
{{- if or .Values.inferenceExtension.sidecar.enabled (include "kvgate-picker.standalone" .) -}}true{{- end -}}
{{- end -}}

{{/* The pool's kvgate.io/profile (the picker's --profile in the standalone mode), or "": the
     picker's --config-file decides. */}}
{{- define "kvgate-picker.profile" -}}
{{- $profile := .Values.inferencePool.profile | default "default" -}}
{{- if and (include "kvgate-picker.pluginsConfig" .) (eq $profile "default") -}}
{{- else if hasKey (.Values.profiles | default dict) $profile -}}
{{- printf "/etc/kvgate/profiles/%s.yaml" $profile -}}
{{- else -}}
{{- $profile -}}
{{- end -}}
{{- end -}}

{{/* kvgate's engine name for inferencePool.modelServerType (endpointsServer.modelServerType in
     the standalone mode, if set). */}}
{{- define "kvgate-picker.engine" -}}
{{- $type := .Values.inferencePool.modelServerType | default "vllm" -}}
{{- if and (include "kvgate-picker.standalone" .) .Values.inferenceExtension.endpointsServer.modelServerType -}}
{{- $type = .Values.inferenceExtension.endpointsServer.modelServerType -}}
{{- end -}}
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
