{{/*
Names and labels: every object of the chart is named and labelled here, the same way.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "vigil.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release's base name: fullnameOverride, else the release name when it already holds the
chart's name, else <release>-<chart>. 63 characters at most (a DNS label), less the longest
suffix added below ("-dashboard", 10 characters), so that no object name is cut.
*/}}
{{- define "vigil.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 53 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's objects: (dict "root" $ "component" "serve"). */}}
{{- define "vigil.componentName" -}}
{{- printf "%s-%s" (include "vigil.fullname" .root) .component -}}
{{- end -}}

{{/* The chart label: name and version. */}}
{{- define "vigil.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that select a component's pods: (dict "root" $ "component" "serve"). */}}
{{- define "vigil.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vigil.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of a component's objects: (dict "root" $ "component" "serve"). */}}
{{- define "vigil.labels" -}}
helm.sh/chart: {{ include "vigil.chart" .root }}
{{ include "vigil.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: vigil
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* The image of every container: repository:tag (tag: the chart's appVersion). */}}
{{- define "vigil.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "vigil.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vigil.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap holding vigil.toml. */}}
{{- define "vigil.configMapName" -}}
{{- include "vigil.componentName" (dict "root" . "component" "config") -}}
{{- end -}}

{{/* Where every container reads vigil.toml, writes its data, and may write temporary files. */}}
{{- define "vigil.configDir" -}}/etc/vigil{{- end -}}
{{- define "vigil.configPath" -}}/etc/vigil/vigil.toml{{- end -}}
{{- define "vigil.dataDir" -}}/var/lib/vigil{{- end -}}

{{/* "true" when Vigil reads a Prometheus (config.engine.prometheus_url): nothing is scraped. */}}
{{- define "vigil.prometheusMode" -}}
{{- if dig "engine" "prometheus_url" "" (.Values.config | default dict) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the cluster serves an API version, "group/version/Kind": what the cluster reports
(.Capabilities), or the values' apiVersions (as `helm template --api-versions` adds them).
(dict "root" $ "api" "monitoring.coreos.com/v1/PrometheusRule")
*/}}
{{- define "vigil.hasAPI" -}}
{{- if or (.root.Capabilities.APIVersions.Has .api) (has .api (.root.Values.apiVersions | default list)) -}}true{{- end -}}
{{- end -}}

{{/* The pod annotations every workload carries: the config's checksum rolls the pods. */}}
{{- define "vigil.podAnnotations" -}}
checksum/config: {{ include "vigil.toml" .root | sha256sum }}
{{- with .annotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The environment every container gets: PGPASSWORD from the PostgreSQL Secret when one of the
config's databases is used by this component, then the component's secretEnv (each from a
Secret's key) and env. (dict "root" $ "values" .Values.serve "postgres" true)
*/}}
{{- define "vigil.env" -}}
{{- $pg := .root.Values.postgresql.passwordSecret -}}
{{- if and .postgres $pg.name }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $pg.name }}
      key: {{ $pg.key }}
{{- end }}
{{- range $name, $ref := .values.secretEnv }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- with .values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The volumes of vigil.toml and /tmp (every pod), as volume entries. */}}
{{- define "vigil.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "vigil.configMapName" . }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSize }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The mounts of vigil.toml, /tmp and the data directory, in every container. */}}
{{- define "vigil.commonMounts" -}}
- name: config
  mountPath: {{ include "vigil.configDir" . }}
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: {{ include "vigil.dataDir" . }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The scheduling keys of a pod: (dict "values" .Values.serve). */}}
{{- define "vigil.scheduling" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The port of config.otlp.listen ("host:port"), or nothing when the receiver is off. A receiver
on loopback could not be reached from outside the pod: refused, naming the key.
*/}}
{{- define "vigil.otlpPort" -}}
{{- $listen := ((.Values.config).otlp).listen | default "" -}}
{{- if $listen -}}
{{- $host := regexReplaceAll ":[0-9]+$" $listen "" | trimAll "[]" -}}
{{- if or (eq $host "127.0.0.1") (eq $host "localhost") (eq $host "::1") -}}
{{- fail (printf "config.otlp.listen %q listens on loopback, which nothing outside the pod reaches: use 0.0.0.0:<port>" $listen) -}}
{{- end -}}
{{- regexFind "[0-9]+$" $listen -}}
{{- end -}}
{{- end -}}
