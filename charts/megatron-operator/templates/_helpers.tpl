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
{{- /* The operator's pods, as the Service, the PDB, the PodMonitor and the NetworkPolicy select
them: with a megatron.dev/ label, which no job's pod can carry (the CRD refuses megatron.dev/
labels in a template), so no pod of a job joins the metrics Service. (The Deployment's own
selector is immutable and keeps the two labels above.) */ -}}
{{- define "megatron-operator.podSelector" -}}
{{ include "megatron-operator.selector" . }}
megatron.dev/operator: {{ .Release.Name }}
{{- end -}}
{{- define "megatron-operator.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
prometheus.io/scheme: https
{{- end -}}
{{/* The namespaces the operator watches, one per line; none in cluster-wide mode. */}}
{{- define "megatron-operator.namespaces" -}}
{{- if not .Values.clusterWide -}}
{{- range .Values.watchNamespaces }}
{{ . }}
{{- end -}}
{{- end -}}
{{- end -}}
{{/* One replica without leader election is fine; several would all reconcile the same jobs. */}}
{{- define "megatron-operator.check" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true: without it every replica reconciles every job" -}}
{{- end -}}
{{- if and .Values.clusterWide .Values.watchNamespaces -}}
{{- fail "clusterWide=true watches every namespace: leave watchNamespaces empty (or set clusterWide=false)" -}}
{{- end -}}
{{- if eq (int .Values.metrics.port) (int .Values.metrics.healthPort) -}}
{{- fail "metrics.port and metrics.healthPort must differ" -}}
{{- end -}}
{{- if and .Values.admissionPolicy.enabled .Values.admissionPolicy.images.requireAllowList (not .Values.admissionPolicy.images.allowed) -}}
{{- fail "admissionPolicy.images.allowed is empty: list the repositories tenants may run, e.g. --set 'admissionPolicy.images.allowed={registry.example.com/ml/*}'" -}}
{{- end -}}
{{- if and (or .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled) (not .Values.metrics.secure) -}}
{{- fail "metrics.secure=false serves /metrics on the pod's loopback only: nothing can scrape it; turn the ServiceMonitor and PodMonitor off, or metrics.secure on" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service=true (it selects the metrics Service); use metrics.podMonitor without a Service" -}}
{{- end -}}
{{- if and (not .Values.clusterWide) (not .Values.watchNamespaces) -}}
{{- fail (printf "watchNamespaces is empty: name the namespaces of your teams' jobs, e.g. --set 'watchNamespaces={team-a}' (the operator's own namespace, %s, holds its keys and takes no jobs), or set clusterWide=true" .Release.Namespace) -}}
{{- end -}}
{{- if has .Release.Namespace (.Values.watchNamespaces | default list) -}}
{{- fail (printf "watchNamespaces lists %s, the operator's own namespace: it holds the operator's keys (the claim seal, the metrics TLS key) and takes no jobs; run jobs in another namespace" .Release.Namespace) -}}
{{- end -}}
{{- end -}}
