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
{{- if .Values.peering.enabled }}true{{ end }}
{{- end }}

{{/* The worker-Lease admission policy and its binding (cluster-scoped, one per release). */}}
{{- define "phalanx.leasePolicyName" -}}
{{- printf "%s-worker-leases" (include "phalanx.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}

{{/* The recording and alerting rules (a PrometheusRule's spec, and a rules file as it is): on the operator's
per-job series, labelled `namespace` and `trainingjob`. */}}
{{- define "phalanx.ruleGroups" -}}
{{- $rule := .Values.metrics.prometheusRule -}}
groups:
  - name: phalanx.rules
    rules:
      - record: phalanx:job_steps_per_second:deriv5m
        expr: deriv(phalanx_job_step[5m])
  - name: phalanx.alerts
    rules:
      - alert: PhalanxTrainingJobStuck
        # Running, its step known for the whole window and the same all along. A job whose script publishes no
        # step (progress Unknown) has no step series: the operator judges it by its heartbeats instead.
        expr: |
          (phalanx_job_state{state="Running"} == 1)
          and on (namespace, trainingjob) (changes(phalanx_job_step[{{ $rule.stuckFor }}]) == 0)
          and on (namespace, trainingjob) (phalanx_job_step offset {{ $rule.stuckFor }})
        for: {{ $rule.stuckPendingFor }}
        labels:
          severity: critical
        annotations:
          summary: TrainingJob {{ "{{ $labels.namespace }}/{{ $labels.trainingjob }}" }} has made no step for {{ $rule.stuckFor }}.
          description: Its state is Running but its step has not moved. Look at `kubectl describe trainingjob` and its workers' logs.
      - alert: PhalanxRecoverySlow
        expr: |
          (phalanx_job_last_recovery_seconds > {{ $rule.slowRecoverySeconds }})
          and on (namespace, trainingjob) (time() - phalanx_job_last_recovery_timestamp_seconds < 1800)
        labels:
          severity: warning
        annotations:
          summary: TrainingJob {{ "{{ $labels.namespace }}/{{ $labels.trainingjob }}" }} took {{ "{{ $value | humanizeDuration }}" }} to recover.
          description: Its latest recovery (failure to training resumed) took longer than {{ $rule.slowRecoverySeconds }} s. Its incidents in `kubectl describe trainingjob` say where the time went.
      - alert: PhalanxGoodputLow
        expr: |
          (phalanx_job_goodput_ratio < {{ $rule.goodputBelow }})
          and on (namespace, trainingjob) (phalanx_job_state{state="Running"} == 1)
        for: 30m
        labels:
          severity: warning
        annotations:
          summary: TrainingJob {{ "{{ $labels.namespace }}/{{ $labels.trainingjob }}" }} trains only {{ "{{ $value | humanizePercentage }}" }} of its time.
          description: Its goodput is under {{ $rule.goodputBelow }}; failures and recoveries take the rest.
      - alert: PhalanxNodeFailingRepeatedly
        expr: sum by (node) (increase(phalanx_node_failures_total[{{ $rule.nodeFailureWindow }}])) >= {{ $rule.nodeFailures }}
        labels:
          severity: warning
        annotations:
          summary: Node {{ "{{ $labels.node }}" }} had {{ "{{ $value }}" }} training failures in {{ $rule.nodeFailureWindow }}.
          description: Failures keep landing on the same node. Cordon it and check its hardware.
      - alert: PhalanxOperatorBacklogged
        # Reconciles that pod and heartbeat events asked for waited for a thread at every look for the whole
        # window: the operator acts on failures late. Its queue holds one entry per job at most: this counts jobs.
        expr: phalanx_reconcile_queue_depth >= {{ $rule.backlogJobs }}
        for: {{ $rule.backlogFor }}
        labels:
          severity: warning
        annotations:
          summary: Operator {{ "{{ $labels.pod }}" }} has had at least {{ $rule.backlogJobs }} jobs waiting for a reconcile for {{ $rule.backlogFor }}.
          description: It acts on pod failures and heartbeats late. Give it more CPU (resources.limits.cpu); phalanx_reconcile_duration_seconds says what each reconcile costs.
{{- end }}

{{/* The Lease the operator's replicas compete for (leader election). */}}
{{- define "phalanx.leaderLease" -}}
{{- printf "%s-leader" (include "phalanx.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
