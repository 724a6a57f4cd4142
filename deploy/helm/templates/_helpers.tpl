{{/* The chart name, for the app.kubernetes.io/name label. */}}
{{- define "portwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: the release name when it contains the chart
name (a release `portwise` gives the base's names: portwise,
portwise-metrics, portwise-leader-election, ...), else RELEASE-NAME.
*/}}
{{- define "portwise.fullname" -}}
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

{{- define "portwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "portwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "portwise.labels" -}}
{{ include "portwise.selectorLabels" . }}
app.kubernetes.io/part-of: portwise
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "portwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "portwise.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "portwise.leaseName" -}}
{{- default (include "portwise.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The ConfigMap mounted at modulesDir, or "" for none. */}}
{{- define "portwise.modulesConfigMap" -}}
{{- if .Values.modules.existingConfigMap }}
{{- .Values.modules.existingConfigMap }}
{{- else if .Values.modules.create }}
{{- printf "%s-modules" (include "portwise.fullname" .) }}
{{- end }}
{{- end }}

{{/* The ConfigMap of public keys mounted at /etc/portwise/signing, or "". */}}
{{- define "portwise.signingKeysConfigMap" -}}
{{- if .Values.moduleSignatures.existingConfigMap }}
{{- .Values.moduleSignatures.existingConfigMap }}
{{- else if .Values.moduleSignatures.publicKeys }}
{{- printf "%s-signing-keys" (include "portwise.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The config file: .Values.config, plus the keys naming the files the chart
mounts (registryAuth, registryCA, moduleSignatures), each only when config
does not set it. With the defaults it is .Values.config as is.
*/}}
{{- define "portwise.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- if and .Values.registry.credentialsSecret (not (get $cfg "registryAuth")) }}
{{- $_ := set $cfg "registryAuth" "/etc/portwise/registry/config.json" }}
{{- end }}
{{- if and .Values.registry.caConfigMap (not (get $cfg "registryCA")) }}
{{- $_ := set $cfg "registryCA" "/etc/portwise/registry-ca/ca.crt" }}
{{- end }}
{{- if and .Values.moduleSignatures.publicKeys (not (get $cfg "moduleSignatures")) }}
{{- $keys := list }}
{{- /* range over a map goes in key order: the list is sorted by name */}}
{{- range $name, $_ := .Values.moduleSignatures.publicKeys }}
{{- $keys = append $keys (printf "/etc/portwise/signing/%s" $name) }}
{{- end }}
{{- $_ := set $cfg "moduleSignatures" (dict "keys" $keys) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The checksum/config pod annotation (reloadConfig: false): the config file
and the chart's signing keys, so that a change of either rolls the pods.
*/}}
{{- define "portwise.configChecksum" -}}
{{- $text := include "portwise.config" . }}
{{- if and .Values.moduleSignatures.publicKeys (not .Values.moduleSignatures.existingConfigMap) }}
{{- $text = printf "%s\n---\n%s" $text (toYaml .Values.moduleSignatures.publicKeys) }}
{{- end }}
{{- $text | sha256sum }}
{{- end }}

{{- define "portwise.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/* Refuses values that cannot work; included by the Deployment. */}}
{{- define "portwise.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled=true: without it every replica writes" }}
{{- end }}
{{- if and (gt (int .Values.shards) 1) (not .Values.leaderElection.enabled) }}
{{- fail "shards > 1 needs leaderElection.enabled=true: the buckets are held on Leases" }}
{{- end }}
{{- if and .Values.moduleSignatures.publicKeys .Values.moduleSignatures.existingConfigMap }}
{{- fail "moduleSignatures: set publicKeys or existingConfigMap, not both" }}
{{- end }}
{{- if and .Values.moduleSignatures.existingConfigMap (not (get (.Values.config | default dict) "moduleSignatures")) }}
{{- fail "moduleSignatures.existingConfigMap is mounted at /etc/portwise/signing/, but config.moduleSignatures.keys does not name its keys: without it portwise accepts unsigned modules" }}
{{- end }}
{{- if not .Values.config.modulesDir }}
{{- if or .Values.modules.binaryData .Values.modules.existingConfigMap }}
{{- fail "modules are given but config.modulesDir is empty: portwise would not load them" }}
{{- end }}
{{- else if not (include "portwise.modulesConfigMap" .) }}
{{- $mounted := false }}
{{- range .Values.extraVolumeMounts }}
{{- if eq (trimSuffix "/" .mountPath) (trimSuffix "/" $.Values.config.modulesDir) }}
{{- $mounted = true }}
{{- end }}
{{- end }}
{{- if not $mounted }}
{{- fail (printf "modules.create=false without modules.existingConfigMap mounts nothing at config.modulesDir (%s): portwise would not start (cannot watch %s). Set modules.existingConfigMap, mount a volume there with extraVolumes and extraVolumeMounts, or set config.modulesDir=null" .Values.config.modulesDir .Values.config.modulesDir) }}
{{- end }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.apiServer) }}
{{- fail "networkPolicy.enabled needs networkPolicy.apiServer (the apiserver's addresses and port, e.g. [{cidr: 10.0.0.1/32, port: 443}]): without it portwise cannot reach the apiserver" }}
{{- end }}
{{- end }}
