//! A table's shape: the envelope columns every table has (fixed names), the columns projected
//! from JSON payloads, the day(timestamp) partitioning and the sort by topic; and how a
//! changed `columns` evolves an existing table instead of making a new one.

use std::collections::BTreeMap;
use std::sync::Arc;

use iceberg::spec::{
    ListType, MapType, NestedField, NullOrder, PrimitiveType, Schema, SortDirection, SortField, SortOrder, Transform,
    Type, UnboundPartitionSpec,
};
use iceberg::{TableCreation, TableUpdate};
use silt_tiering::config::ColumnType;

/// The envelope's field ids at creation (the catalog may renumber; columns are found by name).
const TOPIC: i32 = 1;
const TIMESTAMP: i32 = 6;

fn envelope() -> Vec<NestedField> {
    let string = || Type::Primitive(PrimitiveType::String);
    vec![
        NestedField::required(TOPIC, "topic", string()),
        NestedField::required(
            2,
            "topic_levels",
            Type::List(ListType { element_field: NestedField::list_element(11, string(), true).into() }),
        ),
        NestedField::required(3, "stream", string()),
        NestedField::required(4, "partition", Type::Primitive(PrimitiveType::Int)),
        NestedField::required(5, "offset", Type::Primitive(PrimitiveType::Long)),
        NestedField::required(TIMESTAMP, "timestamp", Type::Primitive(PrimitiveType::Timestamptz)),
        NestedField::optional(7, "key", Type::Primitive(PrimitiveType::Binary)),
        NestedField::required(8, "payload", Type::Primitive(PrimitiveType::Binary)),
        NestedField::required(9, "qos", Type::Primitive(PrimitiveType::Int)),
        NestedField::required(
            10,
            "properties",
            Type::Map(MapType {
                key_field: NestedField::map_key_element(12, string()).into(),
                value_field: NestedField::map_value_element(13, string(), false).into(),
            }),
        ),
    ]
}

/// The envelope columns alone as Arrow, with their field ids: what [`crate::rows::batch`] fills
/// with no projected columns. `silt export --format parquet` writes files with the tables'
/// columns.
pub fn envelope_arrow() -> iceberg::Result<arrow_schema::SchemaRef> {
    let schema = Schema::builder().with_schema_id(0).with_fields(envelope().into_iter().map(Arc::new)).build()?;
    Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?))
}

/// The Iceberg type of a projected column.
pub fn iceberg_type(t: ColumnType) -> Type {
    Type::Primitive(match t {
        ColumnType::Boolean => PrimitiveType::Boolean,
        ColumnType::Int => PrimitiveType::Int,
        ColumnType::Long => PrimitiveType::Long,
        ColumnType::Float => PrimitiveType::Float,
        ColumnType::Double => PrimitiveType::Double,
        ColumnType::String => PrimitiveType::String,
        ColumnType::Timestamp => PrimitiveType::Timestamptz,
    })
}

/// The projected column type a table column has, if it is one a projection can fill.
pub fn column_type(t: &Type) -> Option<ColumnType> {
    match t {
        Type::Primitive(PrimitiveType::Boolean) => Some(ColumnType::Boolean),
        Type::Primitive(PrimitiveType::Int) => Some(ColumnType::Int),
        Type::Primitive(PrimitiveType::Long) => Some(ColumnType::Long),
        Type::Primitive(PrimitiveType::Float) => Some(ColumnType::Float),
        Type::Primitive(PrimitiveType::Double) => Some(ColumnType::Double),
        Type::Primitive(PrimitiveType::String) => Some(ColumnType::String),
        Type::Primitive(PrimitiveType::Timestamptz | PrimitiveType::Timestamp) => Some(ColumnType::Timestamp),
        _ => None,
    }
}

/// What a new table is created with.
pub fn creation(name: &str, columns: &BTreeMap<String, ColumnType>) -> iceberg::Result<TableCreation> {
    let mut fields = envelope();
    for (id, (name, t)) in (100..).zip(columns) {
        fields.push(NestedField::optional(id, name, iceberg_type(*t)));
    }
    let schema = Schema::builder().with_schema_id(0).with_fields(fields.into_iter().map(Arc::new)).build()?;
    let spec = UnboundPartitionSpec::builder().add_partition_field(TIMESTAMP, "timestamp_day", Transform::Day)?.build();
    let sort = SortOrder::builder()
        .with_order_id(1)
        .with_sort_field(SortField {
            source_id: TOPIC,
            transform: Transform::Identity,
            direction: SortDirection::Ascending,
            null_order: NullOrder::First,
        })
        .build_unbound()?;
    Ok(TableCreation::builder()
        .name(name.to_owned())
        .schema(schema)
        .partition_spec(spec)
        .sort_order(sort)
        .properties([
            ("write.format.default".to_string(), "parquet".to_string()),
            ("write.parquet.compression-codec".to_string(), "zstd".to_string()),
            ("silt.writer".to_string(), "silt".to_string()),
        ])
        .build())
}

/// The updates that add the `columns` a table lacks (as optional columns with fresh ids), or
/// nothing. A column whose type differs is left as it is (and said so): values are projected
/// to the table's type.
pub fn evolution(
    table: &str,
    current: &Schema,
    last_column_id: i32,
    next_schema_id: i32,
    columns: &BTreeMap<String, ColumnType>,
) -> iceberg::Result<Vec<TableUpdate>> {
    let mut fields: Vec<Arc<NestedField>> = current.as_struct().fields().to_vec();
    let mut id = last_column_id;
    for (name, t) in columns {
        match current.field_by_name(name) {
            Some(f) => {
                if column_type(&f.field_type) != Some(*t) {
                    tracing::warn!(table, column = %name, has = %f.field_type, configured = ?t,
                        "a projected column keeps the type the table has");
                }
            }
            None => {
                id += 1;
                fields.push(Arc::new(NestedField::optional(id, name, iceberg_type(*t))));
            }
        }
    }
    if id == last_column_id {
        return Ok(Vec::new());
    }
    let schema = Schema::builder().with_schema_id(next_schema_id).with_fields(fields).build()?;
    Ok(vec![TableUpdate::AddSchema { schema }, TableUpdate::SetCurrentSchema { schema_id: -1 }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_columns_are_added_with_fresh_ids_and_old_ones_stay() {
        let cols = |c: &[(&str, ColumnType)]| c.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        let creation = creation("t", &cols(&[("temp", ColumnType::Double)])).unwrap();
        let schema = creation.schema;
        assert_eq!(*schema.field_by_name("payload").unwrap().field_type, Type::Primitive(PrimitiveType::Binary));
        let ups = evolution("t", &schema, 100, 1, &cols(&[("temp", ColumnType::Double), ("unit", ColumnType::String)]))
            .unwrap();
        let TableUpdate::AddSchema { schema: evolved } = &ups[0] else { panic!("{ups:?}") };
        assert_eq!(evolved.field_by_name("unit").unwrap().id, 101);
        assert_eq!(evolved.field_by_name("temp").unwrap().id, schema.field_by_name("temp").unwrap().id);
        assert!(evolved.field_by_name("topic_levels").is_some());
        assert!(evolution("t", &schema, 100, 1, &cols(&[("temp", ColumnType::Long)])).unwrap().is_empty());
    }
}
