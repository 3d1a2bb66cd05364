{{/*
The objects `vigil rules helm` generates from the values (PodMonitors, PrometheusRules, Grafana
dashboard ConfigMaps, the pools' KEDA ScaledObjects) arrive as the values overlay
generated.<kind>, with generated.from: a copy of every value they were made from. The chart
renders them only while that copy equals the values it is given, compared with toJson on both
sides (so Helm formats both): an overlay made for another config fails here, not in the
cluster. The keys picked below are alerts/rules/helm_values.py's GENERATOR_INPUTS.
*/}}
{{- define "vigil.generatedFrom" -}}
{{- $v := .Values -}}
{{- $from := dict "config" ($v.config | default dict) -}}
{{- $_ := set $from "podMonitors" (pick ($v.podMonitors | default dict) "enabled" "podSelector" "port" "podNamespace" "dcgmPodSelector" "dcgmPort" "dcgmNamespace") -}}
{{- $_ := set $from "prometheusRules" (pick ($v.prometheusRules | default dict) "enabled") -}}
{{- $_ := set $from "grafanaDashboards" (pick ($v.grafanaDashboards | default dict) "enabled" "folder") -}}
{{- $_ := set $from "poolScaledObjects" (pick ($v.poolScaledObjects | default dict) "enabled" "prometheusUrl" "scaleTarget" "signal") -}}
{{- toJson $from -}}
{{- end -}}

{{/* "true" when any kind of generated object is enabled. */}}
{{- define "vigil.generatedWanted" -}}
{{- $v := .Values -}}
{{- if or $v.podMonitors.enabled $v.prometheusRules.enabled $v.grafanaDashboards.enabled $v.poolScaledObjects.enabled -}}true{{- end -}}
{{- end -}}

{{- define "vigil.regenerate" -}}
run `vigil rules helm --values <your values files, in helm's order> --out generated-values.yaml` and pass it last: helm install ... -f <your values files> -f generated-values.yaml
{{- end -}}

{{- define "vigil.checkGenerated" -}}
{{- if include "vigil.generatedWanted" . -}}
{{- $gen := .Values.generated | default dict -}}
{{- if not (hasKey $gen "from") -}}
{{- fail (printf "podMonitors, prometheusRules, grafanaDashboards or poolScaledObjects is enabled, but the values hold no generated objects (generated.from is missing): %s" (include "vigil.regenerate" .)) -}}
{{- end -}}
{{- $want := include "vigil.generatedFrom" . -}}
{{- if ne $want (toJson $gen.from) -}}
{{- $wantTree := fromJson $want -}}
{{- $haveTree := $gen.from | default dict -}}
{{- $stale := list -}}
{{- range $section := list "config" "podMonitors" "prometheusRules" "grafanaDashboards" "poolScaledObjects" -}}
{{- $w := get $wantTree $section | default dict -}}
{{- $h := get $haveTree $section | default dict -}}
{{- range $k := concat (keys $w) (keys $h) | uniq | sortAlpha -}}
{{- if ne (toJson (get $w $k)) (toJson (get $h $k)) -}}
{{- $stale = append $stale (printf "%s.%s" $section $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- fail (printf "the generated objects (generated.from) were made from other values than these (%s differ): %s" (join ", " ($stale | default (list "the values"))) (include "vigil.regenerate" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One generated object as the chart applies it: in the release's namespace (or the kind's
namespace value), with the chart's labels over the kind's labels over the generator's.
(dict "root" $ "object" $obj "values" .Values.prometheusRules)
*/}}
{{- define "vigil.generatedObject" -}}
{{- $obj := deepCopy .object -}}
{{- $meta := $obj.metadata | default dict -}}
{{- $chart := include "vigil.labels" (dict "root" .root "component" "monitoring") | fromYaml -}}
{{- $labels := merge $chart (.values.labels | default dict) ($meta.labels | default dict) -}}
{{- $_ := set $meta "labels" $labels -}}
{{- $_ := set $meta "namespace" (.values.namespace | default .root.Release.Namespace) -}}
{{- $_ := set $obj "metadata" $meta -}}
{{ toYaml $obj }}
{{- end -}}
