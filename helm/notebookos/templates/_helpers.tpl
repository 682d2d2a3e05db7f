{{/* Names, labels and derived values shared by the templates. */}}

{{- define "notebookos.fullname" -}}
{{- if contains "notebookos" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-notebookos" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "notebookos.labels" -}}
app.kubernetes.io/name: notebookos
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: notebookos
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "notebookos.selectorLabels" -}}
app.kubernetes.io/name: notebookos
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Namespace of replica and placeholder pods. Empty kernelNamespace: "<release namespace>-kernels", a namespace of
their own (labelled for Pod Security Admission "restricted"), except with objectStore.type=pvc, whose one claim the
gateway and the replicas share and which therefore cannot leave the release namespace. */}}
{{- define "notebookos.kernelNamespace" -}}
{{- if .Values.kernelNamespace -}}
{{- .Values.kernelNamespace -}}
{{- else if eq .Values.objectStore.type "pvc" -}}
{{- .Release.Namespace -}}
{{- else -}}
{{- printf "%s-kernels" .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Every namespace replica pods may run in: the kernel namespace and kernel.allowedNamespaces. */}}
{{- define "notebookos.kernelNamespaces" -}}
{{- prepend .Values.kernel.allowedNamespaces (include "notebookos.kernelNamespace" .) | uniq | join "," -}}
{{- end -}}

{{/* The ConfigMap in each kernel namespace that owns replica pods, placeholders and kernels' Secrets. */}}
{{- define "notebookos.ownerConfigMap" -}}
{{- printf "%s-kernel-owner" (include "notebookos.fullname" .) -}}
{{- end -}}

{{- define "notebookos.gatewayServiceAccount" -}}
{{- default (printf "%s-gateway" (include "notebookos.fullname" .)) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "notebookos.replicaServiceAccount" -}}
{{- default (printf "%s-replica" (include "notebookos.fullname" .)) .Values.replicaServiceAccount.name -}}
{{- end -}}

{{- define "notebookos.gatewayImage" -}}
{{- printf "%s:%s" .Values.gateway.image.repository (default .Chart.AppVersion .Values.gateway.image.tag) -}}
{{- end -}}

{{- define "notebookos.kernelImage" -}}
{{- printf "%s:%s" .Values.kernel.image.repository (default .Chart.AppVersion .Values.kernel.image.tag) -}}
{{- end -}}

{{/* etcd client endpoints, comma-separated host:port. */}}
{{- define "notebookos.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $fullname := include "notebookos.fullname" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s-etcd-%d.%s-etcd-peer.%s.svc:2379" $fullname $i $fullname $.Release.Namespace) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else -}}
{{- required "etcd.external.endpoints is required when etcd.enabled=false" (join "," .Values.etcd.external.endpoints) -}}
{{- end -}}
{{- end -}}

{{- define "notebookos.objectStoreClaim" -}}
{{- if eq .Values.objectStore.type "pvc" -}}
{{- default (printf "%s-object-store" (include "notebookos.fullname" .)) .Values.objectStore.pvc.existingClaim -}}
{{- end -}}
{{- end -}}

{{- define "notebookos.objectStoreUrl" -}}
{{- if eq .Values.objectStore.type "pvc" -}}
{{- printf "file://%s" .Values.objectStore.pvc.mountPath -}}
{{- else if eq .Values.objectStore.type "s3" -}}
{{- required "objectStore.s3.url is required when objectStore.type=s3" .Values.objectStore.s3.url -}}
{{- else -}}
{{- fail "objectStore.type must be pvc or s3" -}}
{{- end -}}
{{- end -}}
