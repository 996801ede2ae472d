{{- define "modelfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "modelfleet.labels" -}}
app.kubernetes.io/name: modelfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "modelfleet.selectorLabels" -}}
app.kubernetes.io/name: modelfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "modelfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "modelfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "modelfleet.gatewayLabels" -}}
app.kubernetes.io/name: modelfleet-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "modelfleet.gatewaySelectorLabels" -}}
app.kubernetes.io/name: modelfleet-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /*
An image reference: image.registry + the image's repository, @digest when one is given, else :tag (the
chart's appVersion by default). Called with (list $ <image values>). No public default exists: without
image.registry the install fails and says what to do.
*/ -}}
{{- define "modelfleet.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $registry := required "image.registry is required: this chart's images are not on a public registry. Build and push them with `make images push REGISTRY=<your registry>` and pass the values it prints (helm install ... -f dist/helm-values.yaml); see docs/install.md" $root.Values.image.registry | trimSuffix "/" -}}
{{- if $img.digest -}}
{{- printf "%s/%s@%s" $registry $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s/%s:%s" $registry $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- /* The external metrics provider's Service and its serving Secret. */ -}}
{{- define "modelfleet.externalMetricsService" -}}
{{- printf "%s-external-metrics" (include "modelfleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "modelfleet.externalMetricsSecret" -}}
{{- .Values.externalMetrics.certSecret | default (printf "%s-tls" (include "modelfleet.externalMetricsService" .) | trunc 63 | trimSuffix "-") -}}
{{- end -}}

{{/*
Logs and traces of the operator and the gateway (the operator passes the endpoint and ratio on to every
runtime pod): docs/operations.md, "Traces".
*/}}
{{- define "modelfleet.telemetryEnv" -}}
- name: MODELFLEET_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- with .Values.tracing.otlpEndpoint }}
- name: MODELFLEET_OTLP_TRACES_ENDPOINT
  value: {{ . | quote }}
- name: MODELFLEET_TRACE_SAMPLE_RATIO
  value: {{ $.Values.tracing.sampleRatio | quote }}
- name: MODELFLEET_TRACE_QUEUE
  value: {{ $.Values.tracing.queueSize | quote }}
{{- end }}
{{- end }}
