use std::path::Path;

use super::*;

fn membership(expr: &str) -> String {
    format!("serviceKey: {{label: g}}\nmembership: {expr}\n")
}

#[test]
fn oci_modules_need_a_digest_unless_tags_are_allowed_and_no_modules_dir() {
    let d = "ab".repeat(32);
    // A digest: valid, without modulesDir.
    Config::from_yaml(&membership(&format!(
        "{{wasm: {{module: 'oci://reg.example/x@sha256:{d}'}}}}"
    )))
    .unwrap();
    let e =
        Config::from_yaml(&membership("{wasm: {module: 'oci://reg.example/x:v1'}}")).unwrap_err();
    assert_eq!(e.field_path(), Some("membership.wasm.module"), "{e}");
    assert!(e.to_string().contains("allowTags"), "{e}");
    Config::from_yaml(&membership(
        "{wasm: {module: 'oci://reg.example/x:v1', allowTags: true}}",
    ))
    .unwrap();
    let e =
        Config::from_yaml(&membership("{wasm: {module: a.wasm, allowTags: true}}")).unwrap_err();
    assert_eq!(e.field_path(), Some("membership.wasm.allowTags"), "{e}");
    let e =
        Config::from_yaml(&format!("maxModuleBytes: 0\n{}", membership("podReady"))).unwrap_err();
    assert_eq!(e.field_path(), Some("maxModuleBytes"), "{e}");
    let c = Config::from_yaml(&format!(
        "registryAuth: /etc/portwise/registry/config.json\nregistryCA: /ca.pem\n{}",
        membership("podReady")
    ))
    .unwrap();
    assert_eq!(c.max_module_bytes, DEFAULT_MAX_MODULE_BYTES);
    assert_eq!(
        c.registry_auth.as_deref(),
        Some(Path::new("/etc/portwise/registry/config.json"))
    );
}

#[test]
fn module_signatures_name_key_files() {
    let c = Config::from_yaml(&format!(
        "moduleSignatures: {{keys: [/keys/a.pub, /keys/b.pub]}}\n{}",
        membership("podReady")
    ))
    .unwrap();
    assert_eq!(
        c.module_signatures.unwrap().keys,
        vec![PathBuf::from("/keys/a.pub"), PathBuf::from("/keys/b.pub")]
    );
    let e = Config::from_yaml(&format!(
        "moduleSignatures: {{keys: []}}\n{}",
        membership("podReady")
    ))
    .unwrap_err();
    assert_eq!(e.field_path(), Some("moduleSignatures.keys"), "{e}");
    assert!(e.to_string().contains("leave moduleSignatures out"), "{e}");
    let e = Config::from_yaml(&format!(
        "moduleSignatures: {{keys: [/a.pub, '']}}\n{}",
        membership("podReady")
    ))
    .unwrap_err();
    assert_eq!(e.field_path(), Some("moduleSignatures.keys[1]"), "{e}");
    // A typo is refused, not ignored (signatures would silently be off).
    let e = Config::from_yaml(&format!(
        "moduleSignatures: {{key: [/a.pub]}}\n{}",
        membership("podReady")
    ))
    .unwrap_err();
    assert!(e.to_string().contains("key"), "{e}");
    assert!(
        Config::from_yaml(&membership("podReady"))
            .unwrap()
            .module_signatures
            .is_none()
    );
}
