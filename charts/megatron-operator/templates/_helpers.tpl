{{- define "megatron-operator.name" -}}megatron-operator{{- end -}}
{{- define "megatron-operator.fullname" -}}{{ .Release.Name }}-megatron-operator{{- end -}}
{{- define "megatron-operator.labels" -}}
app.kubernetes.io/name: megatron-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "megatron-operator.selector" -}}
app.kubernetes.io/name: megatron-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "megatron-operator.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{/* One replica without leader election is fine; several would all reconcile the same jobs. */}}
{{- define "megatron-operator.check" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true: without it every replica reconciles every job" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service=true (it selects the metrics Service); use metrics.podMonitor without a Service" -}}
{{- end -}}
{{- end -}}
