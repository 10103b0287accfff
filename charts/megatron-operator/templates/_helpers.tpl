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
{{/* The namespaces the operator watches, one per line; none in cluster-wide mode (the default:
watchNamespaces empty). */}}
{{- define "megatron-operator.namespaces" -}}
{{- range .Values.watchNamespaces }}
{{ . }}
{{- end -}}
{{- end -}}
{{/* One replica without leader election is fine; several would all reconcile the same jobs. */}}
{{- define "megatron-operator.check" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled=true: without it every replica reconciles every job" -}}
{{- end -}}
{{- if and (not .Values.clusterWide) (not .Values.watchNamespaces) -}}
{{- fail "clusterWide=false needs the namespaces to watch: --set 'watchNamespaces={team-a,team-b}' (jobs belong in the teams' namespaces)" -}}
{{- end -}}
{{- if and .Values.kueue.requireQueueLabel (not .Values.kueue.enabled) -}}
{{- fail "kueue.requireQueueLabel needs kueue.enabled=true: without the integration every job would wait" -}}
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
{{- if has .Release.Namespace (.Values.watchNamespaces | default list) -}}
{{- fail (printf "watchNamespaces lists %s, the operator's own namespace: it holds the operator's keys (the claim seal, the metrics TLS key) and takes no jobs; run jobs in another namespace" .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{/* The operator's --job-defaults file (a MegatronJobDefaults spec, as JSON): trainerImage and
trainerPods, under jobDefaults. */}}
{{- define "megatron-operator.jobDefaults" -}}
{{- $tp := .Values.trainerPods }}
{{- $ids := dict }}
{{- range $key := list "runAsUser" "runAsGroup" "fsGroup" }}
{{- if not (kindIs "invalid" (index $tp $key)) }}
{{- $_ := set $ids $key (index $tp $key) }}
{{- end }}
{{- end }}
{{- $built := dict "image" (printf "%s:%s" .Values.trainerImage.repository (.Values.trainerImage.tag | default .Chart.AppVersion)) "podSecurityContext" $ids }}
{{- /* A trainer.command pod's launcher comes from the operator's own image (an init container). */}}
{{- $_ := set $built "launcherImage" (printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion)) }}
{{- with $tp.serviceAccountAnnotations }}
{{- $_ := set $built "serviceAccount" (dict "annotations" .) }}
{{- end }}
{{- mergeOverwrite $built (deepCopy .Values.jobDefaults) | toJson }}
{{- end -}}
{{/* The Secret a monitor scrapes with: its tokenSecret, or the chart's own (metrics-token.yaml).
Called with (list $ tokenSecret). */}}
{{- define "megatron-operator.metricsToken" -}}
{{- $root := index . 0 -}}
{{- index . 1 | default (printf "%s-metrics-token" (include "megatron-operator.fullname" $root)) -}}
{{- end -}}
{{/* Whether a monitor needs the chart's own scraper token. */}}
{{- define "megatron-operator.ownMetricsToken" -}}
{{- $m := .Values.metrics -}}
{{- if or (and $m.serviceMonitor.enabled (not $m.serviceMonitor.tokenSecret)) (and $m.podMonitor.enabled (not $m.podMonitor.tokenSecret)) -}}
true
{{- end -}}
{{- end -}}
