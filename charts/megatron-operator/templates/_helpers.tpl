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
