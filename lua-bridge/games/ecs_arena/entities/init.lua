-- All entity classes, for require("entities").
return {
  Entity = require("entities.entity"),
  Ship = require("entities.ship"),
  Drone = require("entities.drone"),
  Bullet = require("entities.bullet"),
  Spark = require("entities.spark"),
  Pickup = require("entities.pickup"),
  Wall = require("entities.wall"),
}
