{{/*
The pod of vigil serve, in a StatefulSet (the embedded store: a volume per copy) or a
Deployment (Prometheus mode: nothing kept but the outbox, and that in PostgreSQL or on an
emptyDir). (dict "root" $ "data" <the data volume entry, or "">)
*/}}
{{- define "vigil.serve.pod" -}}
{{- $root := .root -}}
{{- $s := $root.Values.serve -}}
{{- $config := $root.Values.config | default dict -}}
{{- $postgres := or (dig "serve" "database" "" $config) (dig "gateway" "database" "" $config) -}}
metadata:
  labels:
    {{- include "vigil.labels" (dict "root" $root "component" "serve") | nindent 4 }}
    {{- with $s.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- include "vigil.podAnnotations" (dict "root" $root "annotations" $s.podAnnotations) | nindent 4 }}
spec:
  serviceAccountName: {{ include "vigil.serviceAccountName" $root }}
  automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  # serve stops within SHUTDOWN_GRACE (15 s): scrapes, the evaluation and deliveries under way.
  terminationGracePeriodSeconds: {{ $s.terminationGracePeriodSeconds }}
  {{- with include "vigil.scheduling" (dict "values" $s) }}
  {{- . | nindent 2 }}
  {{- end }}
  containers:
    - name: serve
      image: {{ include "vigil.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args:
        - serve
        - --config
        - {{ include "vigil.configPath" $root }}
        # Every address of the pod, for the Service and Prometheus; /metrics and /healthz
        # have no authentication, which --allow-remote acknowledges.
        - --listen
        - 0.0.0.0:{{ $s.port }}
        - --allow-remote
        {{- with $s.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $env := include "vigil.env" (dict "root" $root "values" $s "postgres" $postgres) }}
      {{- if $env }}
      env:
        {{- $env | nindent 8 }}
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ $s.port }}
          protocol: TCP
        {{- with include "vigil.otlpPort" $root }}
        # config.otlp.listen: the OTLP/HTTP receiver routers and vLLM send their spans to.
        - name: otlp
          containerPort: {{ . }}
          protocol: TCP
        {{- end }}
      {{- with $s.startupProbe }}
      startupProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml $s.resources | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "vigil.commonMounts" $root | nindent 8 }}
  volumes:
    {{- include "vigil.commonVolumes" $root | nindent 4 }}
    {{- with .data }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end -}}
