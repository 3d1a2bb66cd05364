{{/*
Render-time checks: a values combination that would deploy something broken or leak a secret
fails here, with the key and the reason, instead of at run time. Called once, from
configmap.yaml (always rendered).
*/}}
{{- define "vigil.checks" -}}
{{- include "vigil.checkSecrets" . -}}
{{- include "vigil.checkServe" . -}}
{{- include "vigil.checkGateway" . -}}
{{- include "vigil.checkDashboard" . -}}
{{- include "vigil.checkGenerated" . -}}
{{- end -}}

{{/*
No secret in the ConfigMap. vigil.toml is a ConfigMap, readable by whoever may read the
namespace's ConfigMaps, and kept in the release's history: a password, a token or a signed
URL must come from a Secret instead. Every string of config is looked at, and the keys of its
free-form maps (labels, match, headers).
*/}}
{{- define "vigil.checkSecrets" -}}
{{- include "vigil.secretWalk" (dict "path" "config" "value" (.Values.config | default dict)) -}}
{{- end -}}

{{- define "vigil.secretWalk" -}}
{{- $path := .path -}}
{{- if kindIs "map" .value -}}
{{- $free := regexMatch "\\.(headers|labels|match)$" $path -}}
{{- range $k, $v := .value -}}
{{- $key := printf "%s.%s" $path $k -}}
{{- if and $free (regexMatch "(?i)(passw|secret|token|api[-_]?key|credential|authorization|signature|cookie|^x-honeycomb-team$)" $k) -}}
{{- if hasSuffix ".headers" $path -}}
{{- fail (printf "%s: a header named like a credential would sit in the ConfigMap; leave it out and set OTEL_EXPORTER_OTLP_HEADERS (\"%s=...\") from a Secret with gateway.secretEnv: the OpenTelemetry exporter adds those headers to the config's" $key $k) -}}
{{- else -}}
{{- fail (printf "%s: a key named like a credential would sit in the ConfigMap; secrets come from Secrets (the components' secretEnv), never from config" $key) -}}
{{- end -}}
{{- end -}}
{{- include "vigil.secretWalk" (dict "path" $key "value" $v) -}}
{{- end -}}
{{- else if kindIs "slice" .value -}}
{{- range $i, $v := .value -}}
{{- include "vigil.secretWalk" (dict "path" (printf "%s[%d]" $path $i) "value" $v) -}}
{{- end -}}
{{- else if kindIs "string" .value -}}
{{- include "vigil.secretString" (dict "path" $path "value" .value) -}}
{{- end -}}
{{- end -}}

{{- define "vigil.secretString" -}}
{{- $path := .path -}}
{{- $v := .value -}}
{{- $database := regexMatch "\\.database$" $path -}}
{{- $userinfo := regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@" $v -}}
{{- $password := regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*:[^/?#@]*@" $v -}}
{{- $query := regexMatch "(?i)[?&](password|passwd|pwd|sslpassword|token|access_token|auth|api[-_]?key|apikey|key|secret|client_secret|sig|signature|x-amz-signature)=" $v -}}
{{- if and $database (or $password $query) -}}
{{- fail (printf "%s: the PostgreSQL URL carries a password, which would sit in the ConfigMap; remove it from the URL and name the Secret that holds it in postgresql.passwordSecret (it becomes PGPASSWORD, which libpq reads)" $path) -}}
{{- else if and (hasSuffix ".prometheus_url" $path) $userinfo -}}
{{- fail (printf "%s: the URL carries credentials (user@ or user:password@), which would sit in the ConfigMap, and Vigil sends none to Prometheus anyway; put an authenticating proxy in front of the API, or reach it inside the cluster without credentials" $path) -}}
{{- else if regexMatch "(?i)^https?://hooks\\.slack\\.com/" $v -}}
{{- fail (printf "%s: a Slack incoming-webhook URL is its own secret (the token is in the path), and would sit in the ConfigMap; send the alerts to Alertmanager instead (format = \"alertmanager_api\"), whose Slack receiver reads the webhook from a Secret file (slack_configs api_url_file), or through a relay inside the cluster that holds the URL" $path) -}}
{{- else if regexMatch "(?i)^https?://([a-z0-9-]+\\.)*(discord(app)?\\.com/api/webhooks/|webhook\\.office\\.com/|chat\\.googleapis\\.com/)" $v -}}
{{- fail (printf "%s: this webhook URL carries its token, and would sit in the ConfigMap; send the alerts to Alertmanager instead (format = \"alertmanager_api\"), whose receivers read such URLs from Secret files, or through a relay inside the cluster that holds the URL" $path) -}}
{{- else if or $password $query -}}
{{- fail (printf "%s: the URL carries a credential (a password in user:password@, or a token, key or signature parameter), which would sit in the ConfigMap; Vigil reads secrets from the environment only (secret_env, password_env, PGPASSWORD): put it in a Secret and use those, or a proxy that adds it" $path) -}}
{{- end -}}
{{- end -}}

{{/* A path Vigil writes must be on the pod's data volume: the root filesystem is read-only. */}}
{{- define "vigil.checkDataPath" -}}
{{- $dir := printf "%s/" (include "vigil.dataDir" .root) -}}
{{- if not (hasPrefix $dir .value) -}}
{{- fail (printf "config.%s = %q: %s writes it, and its only writable folder is the data volume %s (the root filesystem is read-only; a relative path resolves beside vigil.toml, in the read-only ConfigMap): use a path under %s" .key .value .who $dir $dir) -}}
{{- end -}}
{{- end -}}

{{/* Every env var a component gets: the names in its secretEnv and env. */}}
{{- define "vigil.envNames" -}}
{{- $names := keys (.secretEnv | default dict) -}}
{{- range (.env | default list) -}}{{- $names = append $names .name -}}{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "vigil.checkServe" -}}
{{- $s := .Values.serve -}}
{{- if $s.enabled -}}
{{- $config := .Values.config | default dict -}}
{{- $prom := include "vigil.prometheusMode" . -}}
{{- $db := dig "serve" "database" "" $config -}}
{{- $routes := dig "alerts" "routes" (list) $config -}}
{{- if not $prom -}}
{{- include "vigil.checkDataPath" (dict "root" . "key" "store.path" "value" (dig "store" "path" "vigil.db" $config) "who" "vigil serve") -}}
{{- end -}}
{{- if not $db -}}
{{- include "vigil.checkDataPath" (dict "root" . "key" "alerts.outbox_path" "value" (dig "alerts" "outbox_path" "vigil-alerts.db" $config) "who" "vigil serve") -}}
{{- end -}}
{{- if gt (int $s.replicas) 1 -}}
{{- if and (not $prom) $s.persistence.enabled $s.persistence.existingClaim -}}
{{- fail (printf "serve.replicas = %d with serve.persistence.existingClaim: the embedded store is one SQLite file per copy of vigil serve, and copies sharing one claim would share that file (a ReadWriteOnce volume mounts on one node only, and SQLite must not be shared over a network volume); leave existingClaim empty so that each copy gets its own volume (volumeClaimTemplates), or run one copy" (int $s.replicas)) -}}
{{- end -}}
{{- $amOnly := true -}}
{{- range $routes -}}{{- if ne (.format | default "generic") "alertmanager_api" -}}{{- $amOnly = false -}}{{- end -}}{{- end -}}
{{- if and (not $db) (not $amOnly) -}}
{{- fail (printf "serve.replicas = %d without config.serve.database: every copy would keep its own outbox and send every notification; set config.serve.database (a PostgreSQL URL: a shared outbox, and a lease so that one copy delivers), or route only to Alertmanager's API (format = \"alertmanager_api\"), which deduplicates" (int $s.replicas)) -}}
{{- end -}}
{{- end -}}
{{- $env := include "vigil.envNames" $s | fromJsonArray -}}
{{- range $i, $r := $routes -}}
{{- if and $r.secret_env (not (has $r.secret_env $env)) -}}
{{- fail (printf "config.alerts.routes[%d].secret_env = %q: vigil serve gets no such variable, and refuses to send unsigned; add serve.secretEnv.%s = {name: <Secret>, key: <key>}" $i $r.secret_env $r.secret_env) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when a host:port or address listens on loopback only (unreachable from a Service). */}}
{{- define "vigil.loopback" -}}
{{- if regexMatch "^(127\\.|localhost$|localhost:|\\[::1\\]|::1$)" . -}}true{{- end -}}
{{- end -}}

{{- define "vigil.checkGateway" -}}
{{- $g := .Values.gateway -}}
{{- if $g.enabled -}}
{{- $config := .Values.config | default dict -}}
{{- $listen := dig "gateway" "listen" "127.0.0.1:8080" $config -}}
{{- if include "vigil.loopback" $listen -}}
{{- fail (printf "config.gateway.listen = %q listens on loopback, where the gateway's Service cannot reach it: use \"0.0.0.0:%s\"" $listen (regexReplaceAll "^.*:" $listen "")) -}}
{{- end -}}
{{- $db := dig "gateway" "database" "" $config -}}
{{- if not $db -}}
{{- include "vigil.checkDataPath" (dict "root" . "key" "gateway.records_path" "value" (dig "gateway" "records_path" "vigil-gateway.db" $config) "who" "the gateway") -}}
{{- if or (gt (int $g.replicas) 1) $g.autoscaling.enabled $g.keda.enabled -}}
{{- fail "gateway: several copies (gateway.replicas > 1, autoscaling or keda) without config.gateway.database: each would keep its own records, batch queue and cache entries in a SQLite file of its own; set config.gateway.database to a PostgreSQL URL that they share" -}}
{{- end -}}
{{- end -}}
{{- if and $g.autoscaling.enabled $g.keda.enabled -}}
{{- fail "gateway.autoscaling.enabled and gateway.keda.enabled: KEDA makes its own HorizontalPodAutoscaler for the gateway, and two autoscalers would fight over its replicas; enable one" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vigil.checkDashboard" -}}
{{- $d := .Values.dashboard -}}
{{- if $d.enabled -}}
{{- $config := .Values.config | default dict -}}
{{- if not (include "vigil.prometheusMode" .) -}}
{{- fail "dashboard.enabled without config.engine.prometheus_url: the dashboard reads the embedded store, a SQLite file on vigil serve's own volume, which a second pod cannot open; set config.engine.prometheus_url (the dashboard then reads that Prometheus), or run `vigil dashboard` where the store is" -}}
{{- end -}}
{{- $address := dig "dashboard" "address" "127.0.0.1" $config -}}
{{- if include "vigil.loopback" $address -}}
{{- fail (printf "config.dashboard.address = %q listens on loopback, where the dashboard's Service cannot reach it: use \"0.0.0.0\"" $address) -}}
{{- end -}}
{{- $passwordEnv := dig "dashboard" "password_env" "" $config -}}
{{- if or (not $passwordEnv) (not $d.passwordSecret.name) -}}
{{- fail "dashboard.enabled: off loopback the dashboard asks for a password, read from the environment variable named by config.dashboard.password_env; set that name and dashboard.passwordSecret.name (the Secret holding the password, key dashboard.passwordSecret.key)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
