//! Log records as table rows: the envelope, and the projected columns read from top-level
//! fields of a JSON payload (absent, `null` or of the wrong kind: NULL; a payload that is not a
//! JSON object: every projected column NULL; the row is written either way).
//!
//! Conversions into a projected column: `boolean` from a JSON boolean; `int`/`long` from a JSON
//! integer (in range); `float`/`double` from a JSON number; `string` from a JSON string, or the
//! JSON text of a number, boolean, object or array; `timestamp` from an RFC 3339 string or a
//! JSON integer of milliseconds since the epoch.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, ListArray, MapArray, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field, SchemaRef};
use bytes::Bytes;
use serde_json::Value;
use silt_tiering::config::ColumnType;

/// One message, as the table stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub topic: String,
    pub stream: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch.
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub qos: i32,
    pub properties: Vec<(String, String)>,
}

impl Row {
    /// The day (since the epoch) the row is partitioned by.
    pub fn day(&self) -> i32 {
        self.timestamp_ms.div_euclid(86_400_000) as i32
    }
}

/// The payload's top-level fields, if it is a JSON object.
fn json_fields(payload: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let first = payload.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    serde_json::from_slice(payload).ok()
}

fn timestamp_us(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().and_then(|ms| ms.checked_mul(1000)),
        Value::String(s) => chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp_micros()),
        _ => None,
    }
}

fn string_of(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Builds the record batch of `rows` for `schema` (the table's, as Arrow with field ids);
/// `projected` names the columns filled from JSON and their types.
pub fn batch(
    schema: &SchemaRef,
    projected: &BTreeMap<String, ColumnType>,
    rows: &[Row],
) -> Result<RecordBatch, String> {
    let fields: Vec<Option<serde_json::Map<String, Value>>> = if projected.is_empty() {
        vec![None; rows.len()]
    } else {
        rows.iter().map(|r| json_fields(&r.payload)).collect()
    };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array: ArrayRef = match field.name().as_str() {
            "topic" => Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.topic.as_str()))),
            "stream" => Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.stream.as_str()))),
            "partition" => Arc::new(arrow_array::Int32Array::from_iter_values(rows.iter().map(|r| r.partition))),
            "offset" => Arc::new(arrow_array::Int64Array::from_iter_values(rows.iter().map(|r| r.offset))),
            "qos" => Arc::new(arrow_array::Int32Array::from_iter_values(rows.iter().map(|r| r.qos))),
            "timestamp" => {
                let mut b = TimestampMicrosecondBuilder::with_capacity(rows.len());
                for r in rows {
                    b.append_value(r.timestamp_ms.saturating_mul(1000));
                }
                Arc::new(b.finish())
            }
            "key" => {
                let mut b = BinaryBuilder::new();
                for r in rows {
                    b.append_option(r.key.as_deref());
                }
                Arc::new(b.finish())
            }
            "payload" => {
                let mut b = BinaryBuilder::new();
                for r in rows {
                    b.append_value(&r.payload);
                }
                Arc::new(b.finish())
            }
            "topic_levels" => levels(field, rows)?,
            "properties" => properties(field, rows)?,
            name => match projected.get(name) {
                Some(t) => {
                    projected_column(*t, rows.len(), fields.iter().map(|f| f.as_ref().and_then(|m| m.get(name))))
                }
                // A column the table has and the policy no longer names: NULL.
                None => arrow_array::new_null_array(field.data_type(), rows.len()),
            },
        };
        let array = if array.data_type() == field.data_type() {
            array
        } else {
            arrow_cast::cast(&array, field.data_type()).map_err(|e| format!("column {}: {e}", field.name()))?
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

fn projected_column<'a>(t: ColumnType, n: usize, values: impl Iterator<Item = Option<&'a Value>>) -> ArrayRef {
    match t {
        ColumnType::Boolean => {
            let mut b = BooleanBuilder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(Value::as_bool)));
            Arc::new(b.finish())
        }
        ColumnType::Int => {
            let mut b = Int32Builder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(Value::as_i64).and_then(|i| i32::try_from(i).ok())));
            Arc::new(b.finish())
        }
        ColumnType::Long => {
            let mut b = Int64Builder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(Value::as_i64)));
            Arc::new(b.finish())
        }
        ColumnType::Float => {
            let mut b = Float32Builder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(Value::as_f64).map(|f| f as f32)));
            Arc::new(b.finish())
        }
        ColumnType::Double => {
            let mut b = Float64Builder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(Value::as_f64)));
            Arc::new(b.finish())
        }
        ColumnType::String => {
            let mut b = StringBuilder::with_capacity(n, n * 8);
            values.for_each(|v| b.append_option(v.and_then(string_of)));
            Arc::new(b.finish())
        }
        ColumnType::Timestamp => {
            let mut b = TimestampMicrosecondBuilder::with_capacity(n);
            values.for_each(|v| b.append_option(v.and_then(timestamp_us)));
            Arc::new(b.finish())
        }
    }
}

fn child_field(field: &Field) -> Result<Arc<Field>, String> {
    match field.data_type() {
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => Ok(f.clone()),
        other => Err(format!("column {} is {other}, not a list or map", field.name())),
    }
}

/// A string column of `values` of the type `field` has.
fn strings<'a>(field: &Field, values: impl Iterator<Item = &'a str>) -> Result<ArrayRef, String> {
    let a: ArrayRef = Arc::new(StringArray::from_iter_values(values));
    arrow_cast::cast(&a, field.data_type()).map_err(|e| format!("column {}: {e}", field.name()))
}

fn levels(field: &Field, rows: &[Row]) -> Result<ArrayRef, String> {
    let element = child_field(field)?;
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    offsets.push(0i32);
    let mut all = Vec::new();
    for r in rows {
        all.extend(r.topic.split('/'));
        offsets.push(all.len() as i32);
    }
    let values = strings(&element, all.into_iter())?;
    let offsets = arrow_buffer::OffsetBuffer::new(offsets.into());
    Ok(Arc::new(ListArray::try_new(element, offsets, values, None).map_err(|e| e.to_string())?))
}

fn properties(field: &Field, rows: &[Row]) -> Result<ArrayRef, String> {
    let entries = child_field(field)?;
    let DataType::Struct(kv) = entries.data_type() else {
        return Err(format!("map column {} without a struct of entries", field.name()));
    };
    let (key_field, value_field) = (kv[0].clone(), kv[1].clone());
    let mut offsets = vec![0i32];
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for r in rows {
        // A map holds a name once: the last value of a repeated name wins.
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in &r.properties {
            seen.insert(k, v);
        }
        for (k, v) in seen {
            keys.push(k);
            values.push(v);
        }
        offsets.push(keys.len() as i32);
    }
    let k = strings(&key_field, keys.into_iter())?;
    let v = strings(&value_field, values.into_iter())?;
    let entries_array = StructArray::try_new(kv.clone(), vec![k, v], None).map_err(|e| e.to_string())?;
    let offsets = arrow_buffer::OffsetBuffer::new(offsets.into());
    let DataType::Map(_, sorted) = field.data_type() else { unreachable!("checked by child_field") };
    Ok(Arc::new(MapArray::try_new(entries, offsets, entries_array, None, *sorted).map_err(|e| e.to_string())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(topic: &str, payload: &'static str) -> Row {
        Row {
            topic: topic.into(),
            stream: topic.split('/').next().unwrap().into(),
            partition: 0,
            offset: 7,
            timestamp_ms: 1_796_000_000_123,
            key: Some(Bytes::copy_from_slice(topic.as_bytes())),
            payload: Bytes::from_static(payload.as_bytes()),
            qos: 1,
            properties: vec![
                ("a".into(), "1".into()),
                ("a".into(), "2".into()),
                ("mqtt.content_type".into(), "j".into()),
            ],
        }
    }

    #[test]
    fn json_fields_fill_their_columns_and_anything_else_is_null() {
        let cols: BTreeMap<String, ColumnType> = [
            ("temp", ColumnType::Double),
            ("n", ColumnType::Int),
            ("ok", ColumnType::Boolean),
            ("unit", ColumnType::String),
            ("at", ColumnType::Timestamp),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
        let creation = crate::schema::creation("t", &cols).unwrap();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&creation.schema).unwrap());
        let rows = [
            row("plant/line1/temp", r#"{"temp": 21.5, "n": 3, "ok": true, "unit": "C", "at": "2026-12-01T10:00:00Z"}"#),
            row("plant/line1/temp", r#"{"temp": "warm", "n": 1e40, "unit": 5, "at": 1796000000000}"#),
            row("plant/x", "not json at all"),
        ];
        let b = batch(&arrow, &cols, &rows).unwrap();
        assert_eq!(b.num_rows(), 3);
        let f64s = |name: &str| {
            let a = arrow_cast::cast(b.column_by_name(name).unwrap(), &DataType::Float64).unwrap();
            let a = a.as_any().downcast_ref::<arrow_array::Float64Array>().unwrap().clone();
            (0..3).map(|i| (!a.is_null(i)).then(|| a.value(i))).collect::<Vec<_>>()
        };
        assert_eq!(f64s("temp"), [Some(21.5), None, None]);
        assert_eq!(f64s("n"), [Some(3.0), None, None]);
        let unit = arrow_cast::cast(b.column_by_name("unit").unwrap(), &DataType::Utf8).unwrap();
        let unit = unit.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((unit.value(0), unit.value(1), unit.is_null(2)), ("C", "5", true));
        let at = b.column_by_name("at").unwrap();
        assert!(at.is_valid(0) && at.is_valid(1) && at.is_null(2));
        let levels = b.column_by_name("topic_levels").unwrap().as_any().downcast_ref::<ListArray>().unwrap().clone();
        assert_eq!(levels.value(0).len(), 3);
        let props = b.column_by_name("properties").unwrap().as_any().downcast_ref::<MapArray>().unwrap().clone();
        assert_eq!(props.value_length(0), 2, "a repeated name is kept once");
    }
}
