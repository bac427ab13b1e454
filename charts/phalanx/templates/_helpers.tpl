{{/* Name of the chart, overridable. */}}
{{- define "phalanx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name (63 characters at most: a DNS label). */}}
{{- define "phalanx.fullname" -}}
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

{{- define "phalanx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Recommended labels of every object of the release. */}}
{{- define "phalanx.labels" -}}
helm.sh/chart: {{ include "phalanx.chart" . }}
{{ include "phalanx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: phalanx
{{- end }}

{{- define "phalanx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "phalanx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "phalanx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "phalanx.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces watched in namespace scope (the release namespace by default), comma-separated. */}}
{{- define "phalanx.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- join "," .Values.watchNamespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* "true" when replicas must peer (asked for, or more than one replica). */}}
{{- define "phalanx.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The worker-Lease admission policy and its binding (cluster-scoped, one per release). */}}
{{- define "phalanx.leasePolicyName" -}}
{{- printf "%s-worker-leases" (include "phalanx.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}
