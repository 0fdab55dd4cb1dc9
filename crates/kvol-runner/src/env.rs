//! A container's environment as kubelet makes it (kubelet_pods.go's makeEnvironmentVariables): `envFrom`, then `env` with `$(VAR)` expansion, values from fields, resources, ConfigMaps and Secrets, `optional` honoured; pure.

use k8s_openapi::api::core::v1::{Container, EnvVarSource, Pod};
use kvol_api::ObjectSet;
use kvol_api::projection::{NodeResources, PodRef, config_map_keys, field_value, secret_keys};
use kvol_api::subpath_expr::expand;

use crate::labels::PodIds;

/// What the environment is made from besides the pod and the container.
#[derive(Clone, Copy, Debug)]
pub struct EnvContext<'a> {
    pub objects: &'a ObjectSet,
    pub node_name: &'a str,
    /// The node's address (`status.hostIP`; also `status.podIP` on the host network).
    pub host_ip: &'a str,
    /// The pod's address once the runtime said it (`status.podIP`).
    pub pod_ip: &'a str,
    /// A resource limit a container leaves unset is the node's allocatable.
    pub node: NodeResources,
}

/// The container's variables in order (`envFrom` sources first, then `env`; a later name
/// replaces an earlier one in place), or kubelet's error for the first reference that cannot
/// be met (`couldn't find key K in ConfigMap NS/NAME`).
pub fn environment(
    pod: &Pod,
    container: &Container,
    context: &EnvContext<'_>,
) -> Result<Vec<(String, String)>, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let namespace = PodIds::of(pod).namespace;
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.as_deref().unwrap_or_default();
        let keys = if let Some(r) = &source.config_map_ref {
            let found = context.objects.config_maps.get(&format!("{namespace}/{}", r.name));
            match (found, r.optional.unwrap_or(false)) {
                (Some(cm), _) => config_map_keys(cm),
                (None, true) => continue,
                (None, false) => return Err(not_found("configMap", "configmap", namespace, &r.name)),
            }
        } else if let Some(r) = &source.secret_ref {
            let found = context.objects.secrets.get(&format!("{namespace}/{}", r.name));
            match (found, r.optional.unwrap_or(false)) {
                (Some(secret), _) => secret_keys(secret),
                (None, true) => continue,
                (None, false) => return Err(not_found("secret", "secret", namespace, &r.name)),
            }
        } else {
            continue;
        };
        for (key, value) in keys {
            let name = format!("{prefix}{key}");
            // Kubelet skips a key that is not a variable name (with an Event).
            if is_env_var_name(&name) {
                set(&mut vars, name, String::from_utf8_lossy(&value).into_owned());
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let known = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                expand(var.value.as_deref().unwrap_or_default(), &known)
            }
            Some(from) => match value_from(pod, container, from, context)? {
                Some(value) => value,
                None => continue,
            },
        };
        set(&mut vars, var.name.clone(), value);
    }
    Ok(vars)
}

fn set(vars: &mut Vec<(String, String)>, name: String, value: String) {
    match vars.iter_mut().find(|(k, _)| *k == name) {
        Some(existing) => existing.1 = value,
        None => vars.push((name, value)),
    }
}

fn not_found(kind: &str, resource: &str, namespace: &str, name: &str) -> String {
    format!("couldn't get {kind} {namespace}/{name}: {resource} \"{name}\" not found")
}

/// One `valueFrom`; `None` for an optional reference that is not there.
fn value_from(
    pod: &Pod,
    container: &Container,
    from: &EnvVarSource,
    context: &EnvContext<'_>,
) -> Result<Option<String>, String> {
    let namespace = PodIds::of(pod).namespace;
    if let Some(field) = &from.field_ref {
        return field_runtime_value(pod, &field.field_path, context).map(Some);
    }
    if let Some(resource) = &from.resource_field_ref {
        let name = resource.container_name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&container.name);
        let divisor = resource.divisor.as_ref().map(|d| d.0.as_str());
        return resource_runtime_value(pod, name, &resource.resource, divisor, context.node).map(Some);
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional.unwrap_or(false);
        let Some(cm) = context.objects.config_maps.get(&format!("{namespace}/{}", r.name)) else {
            return if optional {
                Ok(None)
            } else {
                Err(not_found("configMap", "configmap", namespace, &r.name))
            };
        };
        return match config_map_keys(cm).remove(&r.key) {
            Some(value) => Ok(Some(String::from_utf8_lossy(&value).into_owned())),
            None if optional => Ok(None),
            None => Err(format!("couldn't find key {} in ConfigMap {namespace}/{}", r.key, r.name)),
        };
    }
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional.unwrap_or(false);
        let Some(secret) = context.objects.secrets.get(&format!("{namespace}/{}", r.name)) else {
            return if optional { Ok(None) } else { Err(not_found("secret", "secret", namespace, &r.name)) };
        };
        return match secret_keys(secret).remove(&r.key) {
            Some(value) => Ok(Some(String::from_utf8_lossy(&value).into_owned())),
            None if optional => Ok(None),
            None => Err(format!("couldn't find key {} in Secret {namespace}/{}", r.key, r.name)),
        };
    }
    Ok(Some(String::new()))
}

/// A `fieldRef` as a container's environment sees it: the pod's metadata as the downward API
/// formats it, and the node and addresses.
fn field_runtime_value(pod: &Pod, path: &str, context: &EnvContext<'_>) -> Result<String, String> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let pod_ip = if host_network { context.host_ip } else { context.pod_ip };
    match path {
        "spec.nodeName" => {
            Ok(spec.and_then(|s| s.node_name.clone()).unwrap_or_else(|| context.node_name.into()))
        }
        "spec.serviceAccountName" => {
            Ok(spec.and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into()))
        }
        "status.hostIP" => Ok(context.host_ip.into()),
        "status.podIP" | "status.podIPs" => Ok(pod_ip.into()),
        _ => {
            let ids = PodIds::of(pod);
            field_value(PodRef { pod, namespace: ids.namespace, uid: ids.uid }, path)
                .map_err(|_| format!("unsupported fieldPath: {path}"))
        }
    }
}

/// A `resourceFieldRef`: the container's limit (the node's allocatable when unset) or request
/// (its limit when unset), divided by the divisor and rounded up.
pub fn resource_runtime_value(
    pod: &Pod,
    container_name: &str,
    resource: &str,
    divisor: Option<&str>,
    node: NodeResources,
) -> Result<String, String> {
    // The downward API's one implementation, volumes' and env's alike.
    kvol_api::projection::container_resource(pod, &node, container_name, resource, divisor)
}

/// Kubernetes' `IsEnvVarName`: letters, digits, `_`, `-`, `.`, not starting with a digit.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '_' | '-' | '.'));
    first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
