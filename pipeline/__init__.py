"""The PySpark data source (`format("seglog")`). It arrives with the Spark work; today this
package is the place it will live."""
